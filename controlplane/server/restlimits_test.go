package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/devstack"
)

// endless yields n bytes of a JSON string body without holding them. The
// transport reads it on its own goroutine, possibly after the response, so
// the count is atomic.
type endless struct {
	n    int64
	sent atomic.Int64
}

func (e *endless) Read(p []byte) (int, error) {
	sent := e.sent.Load()
	if sent >= e.n {
		return 0, io.EOF
	}
	if int64(len(p)) > e.n-sent {
		p = p[:e.n-sent]
	}
	for i := range p {
		p[i] = 'a'
	}
	if sent == 0 && len(p) >= 9 {
		copy(p, `{"name":"`)
	}
	e.sent.Add(int64(len(p)))
	return len(p), nil
}

// TestRESTBodyLimit: a body over 4 MiB is refused with 413 before the
// gateway decodes it, whether it declares its length or streams it chunked.
func TestRESTBodyLimit(t *testing.T) {
	t.Parallel()
	in := controlplanetest.Start(t, env.Config(t), true)
	url := "http://" + in.Server.RESTAddr() + "/api/v1/controlplane/auth/authorize"
	for _, tc := range []struct {
		name    string
		chunked bool
		size    int64
	}{
		{"declared 5 MiB", false, 5 << 20},
		{"chunked 64 MiB", true, 64 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &endless{n: tc.size}
			req, _ := http.NewRequest("POST", url, io.NopCloser(body))
			if !tc.chunked {
				req.ContentLength = tc.size
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Fatalf("status = %d (%.200s), want 413", resp.StatusCode, b)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil || !strings.Contains(fmt.Sprint(m["message"]), "4194304") {
				t.Errorf("body = %.200s, want a JSON error naming the limit", b)
			}
			if n := body.sent.Load(); n > 32<<20 { // the limit, plus what socket buffers took
				t.Errorf("the server read %d bytes of a refused body", n)
			}
		})
	}
	// A body under the limit still reaches the API.
	if code, _ := restAuthorize(t, in.Server.RESTAddr(), "", ""); code != http.StatusUnauthorized && code != http.StatusForbidden {
		t.Errorf("small request: status %d", code)
	}
}

func scrape(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetricsNotPublic: /metrics is not on the public REST port; it is on
// its own (loopback) address, and with a token it needs the token wherever
// it is served.
func TestMetricsNotPublic(t *testing.T) {
	t.Parallel()
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := env.Config(t)
	cfg.Controlplane.Metrics.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	in := controlplanetest.Start(t, cfg, true)
	if code, body := scrape(t, "http://"+in.Server.RESTAddr()+"/metrics", ""); code != http.StatusNotFound {
		t.Errorf("REST /metrics without a token: status %d (%.100s), want 404", code, body)
	}
	if code, body := scrape(t, "http://"+cfg.Controlplane.Metrics.Addr+"/metrics", ""); code != http.StatusOK || !strings.Contains(body, "controlplane_dependency_up") {
		t.Errorf("metrics address: status %d (%.100s)", code, body)
	}

	const token = "metrics-token-0123456789abcdefghij"
	cfg = env.Config(t)
	cfg.Controlplane.Metrics.Token = token
	in = controlplanetest.Start(t, cfg, true)
	for _, url := range []string{"http://" + in.Server.RESTAddr() + "/metrics", "http://" + in.Server.MetricsAddr() + "/metrics"} {
		for _, bad := range []string{"", "wrong-token-0123456789abcdefghijklmn"} {
			if code, _ := scrape(t, url, bad); code != http.StatusUnauthorized {
				t.Errorf("%s with token %q: status %d, want 401", url, bad, code)
			}
		}
		if code, body := scrape(t, url, token); code != http.StatusOK || !strings.Contains(body, "controlplane_dependency_up") {
			t.Errorf("%s with the token: status %d", url, code)
		}
	}
}
