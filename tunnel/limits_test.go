package tunnel_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"

	"github.com/levers9/levers9/tunnel/tunneltest"
	"google.golang.org/grpc"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/tunnel"
)

// connectProxy is a minimal HTTP CONNECT proxy on 127.0.0.1.
type connectProxy struct {
	l       net.Listener
	targets sync.Map // target -> count
	wg      sync.WaitGroup
}

func newConnectProxy(t *testing.T) *connectProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connectProxy{l: l}
	var conns sync.Map
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil || req.Method != http.MethodConnect {
					return
				}
				n, _ := p.targets.LoadOrStore(req.Host, new(atomic.Int64))
				n.(*atomic.Int64).Add(1)
				up, err := net.Dial("tcp", req.Host)
				if err != nil {
					_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
					return
				}
				conns.Store(up, true)
				defer up.Close()
				_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
				go func() { _, _ = io.Copy(up, br); _ = up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		conns.Range(func(k, _ any) bool { _ = k.(net.Conn).Close(); return true })
		p.wg.Wait()
	})
	return p
}

func TestHTTPConnectProxy(t *testing.T) {
	e := setupCP(t, cpOpts{})
	p := newConnectProxy(t)
	purl := &url.URL{Scheme: "http", Host: p.l.Addr().String()}
	setupAgent(t, e, "m-proxy", func(c *tunnel.ClientConfig) {
		c.DisableQUIC = true
		c.Proxy = func(string) (*url.URL, error) { return purl, nil }
	})
	e.waitPush(t, 5*time.Second, "m-proxy", "via proxy")
	n, ok := p.targets.Load(e.addr)
	if !ok || n.(*atomic.Int64).Load() < 1 {
		t.Fatalf("proxy saw no CONNECT to %s", e.addr)
	}
}

func TestProxyFromEnvironment(t *testing.T) {
	t.Setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
	t.Setenv("NO_PROXY", "skip.invalid")
	f := tunnel.ProxyFromEnvironment()
	u, err := f("cp.invalid:1995")
	if err != nil || u == nil || u.Host != "proxy.invalid:3128" {
		t.Fatalf("proxy for cp: %v %v", u, err)
	}
	if u, err := f("skip.invalid:1995"); err != nil || u != nil {
		t.Fatalf("NO_PROXY ignored: %v %v", u, err)
	}
}

// Bad clients (garbage, truncated TLS, garbage after a good TLS handshake,
// slowloris) lose their own connection; the good agent's session stays.
func TestBadClientsCloseOnlyTheirSession(t *testing.T) {
	live := fast
	live.HandshakeTimeout = 500 * time.Millisecond
	e := setupCP(t, cpOpts{live: live})
	a := setupAgent(t, e, "m-good", func(c *tunnel.ClientConfig) { c.DisableQUIC = true })
	e.waitPush(t, 5*time.Second, "m-good", "x")
	good := a.last()
	ctls, err := e.ca.ClientTLS("m-bad")
	if err != nil {
		t.Fatal(err)
	}
	ctls.NextProtos = []string{tunnel.ALPN}
	ctls.ServerName = "127.0.0.1"

	cases := []struct {
		name string
		run  func(c net.Conn) error
	}{
		{"garbage", func(c net.Conn) error { _, err := c.Write([]byte("GET / HTTP/1.1\r\n\r\n\x00\x01garbage")); return err }},
		{"truncated TLS record", func(c net.Conn) error { _, err := c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}); return err }},
		{"slowloris", func(c net.Conn) error { _, err := c.Write([]byte{0x16}); return err }},
		{"garbage yamux frames", func(c net.Conn) error {
			tc := tls.Client(c, ctls)
			if err := tc.Handshake(); err != nil {
				return err
			}
			_, err := tc.Write([]byte{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9})
			return err
		}},
		{"truncated yamux frame", func(c net.Conn) error {
			tc := tls.Client(c, ctls)
			if err := tc.Handshake(); err != nil {
				return err
			}
			_, err := tc.Write([]byte{0, 1, 0})
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "failed")
			c, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := tc.run(c); err != nil {
				t.Fatalf("bad client: %v", err)
			}
			// The server hangs up on it within the handshake timeout.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			start := time.Now()
			_, err = io.Copy(io.Discard, c)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("server did not close the bad connection")
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("closing took %s", d)
			}
			testenv.Eventually(t, 2*time.Second, "failed handshake counted", func() bool {
				return e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "failed") > before
			})
			if good.Err() != nil || a.last() != good {
				t.Fatalf("good session hurt: %v", good.Err())
			}
		})
	}
	// Garbage at the QUIC port is dropped without harm.
	u, err := net.Dial("udp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		_, _ = u.Write([]byte(strings.Repeat("\xc3garbage", 160)))
	}
	_ = u.Close()
	e.waitPush(t, 2*time.Second, "m-good", "still fine")
	if a.last() != good {
		t.Fatal("good session replaced")
	}
}

// An agent that hangs up mid-handshake (the loser of its own race) is
// counted as abandoned, not failed: operators alert on failures.
func TestHandshakeHungUpIsAbandonedNotFailed(t *testing.T) {
	e := setupCP(t, cpOpts{})
	for _, hangUp := range []struct {
		name  string
		close func(*net.TCPConn) error
	}{
		{"close", (*net.TCPConn).Close},
		{"reset", func(c *net.TCPConn) error { _ = c.SetLinger(0); return c.Close() }},
	} {
		before := e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "abandoned")
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		// Half a TLS record header: the server is inside the handshake.
		if _, err := c.Write([]byte{22, 3, 1}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		if err := hangUp.close(c.(*net.TCPConn)); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 2*time.Second, hangUp.name+": abandoned handshake counted", func() bool {
			return e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "abandoned") > before
		})
	}
	if got := e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "failed"); got != 0 {
		t.Fatalf("%v handshakes counted as failed, want 0", got)
	}
}

func TestMaxStreamsPerSession(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			const max = 4
			e := setupCP(t, cpOpts{limits: tunnel.Limits{MaxStreams: max}})
			a := setupAgent(t, e, "m-streams", tr.mod)
			e.waitPush(t, 5*time.Second, "m-streams", "x")
			s := a.last()
			// The hub's push ClientConn and the agent's ClientConn may hold
			// one stream each; open raw streams until the server stops taking them.
			var held []net.Conn
			defer func() {
				for _, c := range held {
					_ = c.Close()
				}
			}()
			refused := false
			for i := 0; i < max+2 && !refused; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				c, err := s.OpenStream(ctx)
				cancel()
				if err != nil {
					refused = true
					break
				}
				held = append(held, c)
				// A refused stream is reset by the server: the write or the
				// read that follows fails.
				_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
				if _, err := c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
					refused = true
					break
				}
				buf := make([]byte, 9)
				if _, err := io.ReadFull(c, buf); err != nil {
					refused = true
				}
			}
			if !refused {
				t.Fatalf("opened %d streams past a limit of %d", len(held), max)
			}
			if s.Err() != nil {
				t.Fatalf("session ended over a stream limit: %v", s.Err())
			}
		})
	}
}

func TestAutoStartStopStress(t *testing.T) {
	e := setupCP(t, cpOpts{})
	ctls, err := e.ca.ClientTLS("m-ss")
	if err != nil {
		t.Fatal(err)
	}
	cfg := tunnel.ClientConfig{Addrs: []string{e.addr}, TLS: ctls, Liveness: fast, Proxy: noProxy}
	a, err := tunnel.NewAuto(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Stop() // before Start
	if err := a.Start(context.Background()); err == nil {
		t.Fatal("Start after Stop succeeded")
	}
	for i := range 20 {
		a, err := tunnel.NewAuto(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if _, err := a.Session(ctx); err != nil {
				t.Fatal(err)
			}
			cancel()
		}
		a.Stop()
		a.Stop()
	}
	srv, err := tunnel.NewServer(tunnel.ServerConfig{Addr: "127.0.0.1:0", TLS: mustServerTLS(t, e), Authorize: func(context.Context, *x509.Certificate) (string, error) { return "x", nil }})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	srv.Stop()
	testenv.Eventually(t, 5*time.Second, "server sessions gone", func() bool { return e.srv.SessionsForTest() == 0 })
}

func mustServerTLS(t *testing.T, e *cpEnv) *tls.Config {
	c, err := e.ca.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Agents connect and disconnect at random while pushes run; afterwards
// goroutines and the heap are back where they started and stream counters
// balance. L9_SOAK=10m runs it as the 10-minute soak.
func TestChurn(t *testing.T) {
	base := runtime.NumGoroutine()
	baseHeap := heapInUse()
	duration := 4 * time.Second
	if testing.Short() {
		duration = time.Second
	}
	if v := os.Getenv("L9_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("L9_SOAK=%q: %v", v, err)
		}
		duration = d
	}
	func() {
		e := setupCP(t, cpOpts{})
		const agents = 12
		stopAt := time.Now().Add(duration)
		var wg sync.WaitGroup
		var pushes, fails atomic.Int64
		for i := range agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cn := "m-churn-" + string(rune('a'+i))
				for time.Now().Before(stopAt) {
					a := startBareAgent(t, e, cn, i%2 == 0)
					// A life starts once the agent is in (or after 3 s), so
					// a loaded machine slows the churn instead of ending
					// every agent before its handshake completes.
					in := time.Now().Add(3 * time.Second)
					for time.Now().Before(in) {
						ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
						_, err := e.push(ctx, cn, "p")
						cancel()
						if err == nil {
							pushes.Add(1)
							break
						}
						time.Sleep(10 * time.Millisecond)
					}
					life := time.Duration(50+rand.IntN(300)) * time.Millisecond
					end := time.Now().Add(life)
					for time.Now().Before(end) {
						ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
						if _, err := e.push(ctx, cn, "p"); err == nil {
							pushes.Add(1)
						} else {
							fails.Add(1)
						}
						cancel()
						time.Sleep(10 * time.Millisecond) // pacing, not synchronisation
					}
					a.stop()
				}
			}()
		}
		wg.Wait()
		if pushes.Load() == 0 {
			t.Fatalf("no push worked during churn (%d failed)", fails.Load())
		}
		testenv.Eventually(t, 5*time.Second, "sessions drained", func() bool { return e.srv.SessionsForTest() == 0 })
		testenv.Eventually(t, 5*time.Second, "server streams balance", func() bool {
			return e.counter("levers9_tunnel_streams_opened_total") == e.counter("levers9_tunnel_streams_closed_total")
		})
		if e.counter("levers9_tunnel_streams_opened_total") == 0 {
			t.Fatal("no streams counted")
		}
		t.Logf("churn: %d pushes ok, %d failed, %v streams", pushes.Load(), fails.Load(), e.counter("levers9_tunnel_streams_opened_total"))
		e.srv.Stop()
	}()
	testenv.Eventually(t, 10*time.Second, "goroutines back to baseline", func() bool { return runtime.NumGoroutine() <= base+2 })
	// Some growth is the runtime's own (pools, metrics, TLS session
	// caches); a leak of what every session holds grows with the churn.
	var after uint64
	testenv.Eventually(t, 10*time.Second, "heap back near its start", func() bool {
		after = heapInUse()
		return after < baseHeap+4<<20
	})
	t.Logf("churn %s: goroutines %d -> %d, heap in use %d KiB -> %d KiB", duration, base, runtime.NumGoroutine(), baseHeap>>10, after>>10)
}

// heapInUse is the live heap after a collection (HeapAlloc: the spans the
// allocator keeps around would hide a leak or invent one).
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

type bareAgent struct {
	stop func()
}

func startBareAgent(t *testing.T, e *cpEnv, cn string, quic bool) *bareAgent {
	ctls, err := e.ca.ClientTLS(cn)
	if err != nil {
		t.Error(err)
		return &bareAgent{stop: func() {}}
	}
	gs := grpc.NewServer()
	tunneltest.RegisterEcho(gs, func(_ context.Context, in []byte) ([]byte, error) { return in, nil })
	a, err := tunnel.NewAuto(tunnel.ClientConfig{
		Addrs: []string{e.addr}, TLS: ctls, Liveness: fast, Proxy: noProxy,
		DisableQUIC: !quic, DisableTCP: quic,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Metrics: e.metrics,
	}, func(ctx context.Context, s tunnel.Session) { tunnel.ServeGRPC(ctx, s, gs) })
	if err != nil {
		t.Error(err)
		return &bareAgent{stop: func() {}}
	}
	_ = a.Start(context.Background())
	return &bareAgent{stop: func() { a.Stop(); gs.Stop() }}
}

// Over MaxConcurrentHandshakes a new connection is dropped before any
// crypto; once the slot frees up the agent gets in.
func TestHandshakeConcurrencyCap(t *testing.T) {
	live := fast
	live.HandshakeTimeout = 1500 * time.Millisecond
	e := setupCP(t, cpOpts{live: live, maxHandshakes: 1})
	// A slowloris holds the only slot.
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testenv.Eventually(t, 2*time.Second, "slowloris holds the slot", func() bool { return e.srv.InflightHandshakesForTest() == 1 })
	ctls, err := e.ca.ClientTLS("m-cap")
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range transports {
		cfg := tunnel.ClientConfig{Addrs: []string{e.addr}, TLS: ctls, Liveness: fast, Proxy: noProxy}
		tr.mod(&cfg)
		d, err := tunnel.NewDirect(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		s, err := d.Dial(ctx, tunnel.DialRace)
		cancel()
		if err == nil {
			_ = s.Close()
			t.Fatalf("%s: admitted while the slowloris held the only handshake slot", tr.name)
		}
		if time.Since(start) > time.Second {
			t.Fatalf("%s: refusal took %s, want it before any crypto", tr.name, time.Since(start))
		}
		var r *tunnel.RefusedError
		if !errors.As(err, &r) {
			t.Fatalf("%s: %v is not a refusal", tr.name, err)
		}
		// Over TCP the busy record carries the server's hint (at least
		// minBusyWait); QUIC's CONNECTION_REFUSED has no room for one.
		if tr.want == tunnel.TransportTCP && r.RetryAfter < 250*time.Millisecond {
			t.Fatalf("tcp refusal hint %s, want >= 250ms", r.RetryAfter)
		}
	}
	if got := e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "refused"); got < 2 {
		t.Fatalf("refused handshakes %v, want >= 2", got)
	}
	// The slowloris times out, the slot frees, an agent gets in.
	setupAgent(t, e, "m-cap", nil)
	e.waitPush(t, 10*time.Second, "m-cap", "in")
}
