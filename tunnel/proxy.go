package tunnel

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"

	"golang.org/x/net/http/httpproxy"

	"github.com/levers9/levers9/internal/errdefs"
)

// ProxyFunc returns the HTTP proxy to reach target ("host:port") through, or
// nil for a direct connection.
type ProxyFunc func(target string) (*url.URL, error)

// ProxyFromEnvironment honours HTTPS_PROXY and NO_PROXY (and their lower-case
// forms), read once when called.
func ProxyFromEnvironment() ProxyFunc {
	f := httpproxy.FromEnvironment().ProxyFunc()
	return func(target string) (*url.URL, error) {
		return f(&url.URL{Scheme: "https", Host: target})
	}
}

// dialConnect opens a TCP tunnel to target through an HTTP CONNECT proxy.
// Proxy credentials come from the proxy URL's user info and are never logged.
func dialConnect(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), proxy *url.URL, target string) (net.Conn, error) {
	if proxy.Scheme != "http" && proxy.Scheme != "" {
		return nil, fmt.Errorf("proxy for %s: scheme %q not supported (only http): %w", target, proxy.Scheme, errdefs.ErrInvalidArgument)
	}
	c, err := dial(ctx, "tcp", proxy.Host)
	if err != nil {
		return nil, fmt.Errorf("dialling proxy %s for %s: %w", proxy.Host, target, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: target},
		Host:   target,
		Header: make(http.Header),
	}
	if u := proxy.User; u != nil {
		p, _ := u.Password()
		req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+p)))
	}
	if err := req.Write(c); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("CONNECT %s via proxy %s: %w", target, proxy.Host, err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("CONNECT %s via proxy %s: reading answer: %w", target, proxy.Host, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_ = c.Close()
		return nil, fmt.Errorf("CONNECT %s via proxy %s: %s: %w", target, proxy.Host, resp.Status, errdefs.ErrUnavailable)
	}
	if ctx.Err() != nil {
		_ = c.Close()
		return nil, ctx.Err()
	}
	if br.Buffered() > 0 {
		return &bufferedConn{Conn: c, r: br}, nil
	}
	return c, nil
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }
