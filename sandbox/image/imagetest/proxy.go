package imagetest

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
)

var blobGetRE = regexp.MustCompile(`^/v2/.+/blobs/sha256:[a-f0-9]{64}$`)

// Proxy is a reverse proxy on 127.0.0.1 in front of a registry. It counts
// blob GETs and can corrupt blob bodies on request.
type Proxy struct {
	// Host is "127.0.0.1:PORT".
	Host string

	// mu guards the fields below.
	mu sync.Mutex
	// blobGets counts GETs per blob digest.
	blobGets map[string]int
	// pings counts GETs of /v2/ (a client finding out how to log in).
	pings int
	// corrupt lists digests whose body gets one byte flipped.
	corrupt map[string]bool
}

// StartProxy starts a proxy to registryHost and closes it in t.Cleanup.
func StartProxy(t testing.TB, registryHost string) *Proxy {
	t.Helper()
	target := &url.URL{Scheme: "http", Host: registryHost}
	p := &Proxy{blobGets: map[string]int{}, corrupt: map[string]bool{}}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = p.modify
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && blobGetRE.MatchString(r.URL.Path) {
			p.mu.Lock()
			p.blobGets[digestOf(r.URL.Path)]++
			p.mu.Unlock()
		}
		if r.Method == http.MethodGet && r.URL.Path == "/v2/" {
			p.mu.Lock()
			p.pings++
			p.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	p.Host = l.Addr().String()
	return p
}

func digestOf(path string) string { return path[strings.LastIndex(path, "/")+1:] }

func (p *Proxy) modify(resp *http.Response) error {
	if resp.Request.Method != http.MethodGet || !blobGetRE.MatchString(resp.Request.URL.Path) || resp.StatusCode != http.StatusOK {
		return nil
	}
	p.mu.Lock()
	bad := p.corrupt[digestOf(resp.Request.URL.Path)]
	p.mu.Unlock()
	if !bad {
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	if len(body) > 0 {
		body[len(body)/2] ^= 0xff
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return nil
}

// Corrupt makes the proxy flip a byte in every later body of blob digest.
func (p *Proxy) Corrupt(digest string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.corrupt[digest] = true
}

// BlobGets returns how many times blob digest was fetched.
func (p *Proxy) BlobGets(digest string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blobGets[digest]
}

// TotalBlobGets returns the number of blob GETs of any digest.
func (p *Proxy) TotalBlobGets() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.blobGets {
		n += c
	}
	return n
}

// Pings returns how many times a client pinged the registry (GET /v2/).
func (p *Proxy) Pings() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pings
}
