package tunnel_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/tunnel"
	"github.com/levers9/levers9/tunnel/tunneltest"
)

// fast are liveness settings scaled down so tests run quickly.
var fast = tunnel.Liveness{HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: 600 * time.Millisecond, HandshakeTimeout: 2 * time.Second}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type cpEnv struct {
	ca      *tunneltest.CA
	srv     *tunnel.Server
	hub     *tunnel.Hub
	addr    string
	reg     *prometheus.Registry
	metrics *tunnel.Metrics
	revoked sync.Map // CN -> true
}

type cpOpts struct {
	addr          string
	live          tunnel.Liveness
	rate          float64
	burst         int
	startFn       func(func() error) error // wraps Start (e.g. inside a netns)
	ca            *tunneltest.CA
	limits        tunnel.Limits
	maxHandshakes int
	pushIdle      time.Duration
	hubClock      clock.Clock
	// perSource, retryAt and helloTimeout set MaxHandshakesPerSource,
	// QUICRetryThreshold and ClientHelloTimeout.
	perSource    int
	retryAt      int
	helloTimeout time.Duration
}

// setupCP starts a controlplane side: server + hub with an echo service that
// answers "cp:<caller identity>:<payload>".
func setupCP(t testing.TB, o cpOpts) *cpEnv {
	t.Helper()
	e := &cpEnv{reg: prometheus.NewRegistry(), ca: o.ca}
	var err error
	if e.ca == nil {
		e.ca, err = tunneltest.NewCA("l9t-test-ca")
		if err != nil {
			t.Fatal(err)
		}
	}
	e.metrics, err = tunnel.NewMetrics(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(tunnel.ServerOptions(o.limits)...)
	tunneltest.RegisterEcho(gs, func(ctx context.Context, in []byte) ([]byte, error) {
		a, ok := tunnel.CallerFromContext(ctx)
		if !ok {
			return nil, errors.New("no tunnel caller in context")
		}
		return []byte("cp:" + a.Identity + ":" + string(in)), nil
	})
	e.hub, err = tunnel.NewHub(tunnel.HubConfig{
		Server:          gs,
		Limits:          o.limits,
		PushIdleTimeout: o.pushIdle,
		Clock:           o.hubClock,
	})
	if err != nil {
		t.Fatal(err)
	}
	stls, err := e.ca.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	if o.addr == "" {
		o.addr = "127.0.0.1:0"
	}
	if o.live == (tunnel.Liveness{}) {
		o.live = fast
	}
	e.srv, err = tunnel.NewServer(tunnel.ServerConfig{
		Addr: o.addr, TLS: stls, Liveness: o.live, Limits: o.limits,
		HandshakesPerSecond: o.rate, HandshakeBurst: o.burst, MaxConcurrentHandshakes: o.maxHandshakes,
		MaxHandshakesPerSource: o.perSource, QUICRetryThreshold: o.retryAt, ClientHelloTimeout: o.helloTimeout,
		Authorize: func(_ context.Context, c *x509.Certificate) (string, error) {
			cn := c.Subject.CommonName
			if _, ok := e.revoked.Load(cn); ok {
				return "", fmt.Errorf("certificate of %s revoked: %w", cn, errdefs.ErrPermissionDenied)
			}
			if strings.HasPrefix(cn, "unknown") {
				return "", fmt.Errorf("no machine for %s: %w", cn, errdefs.ErrNotFound)
			}
			return cn, nil
		},
		OnSession: e.hub.HandleSession,
		Logger:    testLogger(t),
		Metrics:   e.metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := func() error { return e.srv.Start(context.Background()) }
	if o.startFn != nil {
		err = o.startFn(start)
	} else {
		err = start()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gs.Stop)
	t.Cleanup(e.srv.Stop)
	e.addr = e.srv.Addr().String()
	return e
}

func (e *cpEnv) counter(name string, labels ...string) float64 {
	mfs, err := e.reg.Gather()
	if err != nil {
		panic(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			if m.Counter != nil {
				sum += m.Counter.GetValue()
			}
			if m.Gauge != nil {
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

type agentEnv struct {
	auto *tunnel.Auto
	cc   *grpc.ClientConn
	gs   *grpc.Server
	reg  *prometheus.Registry
	// sessions receives every session the agent gets.
	mu       sync.Mutex
	sessions []tunnel.Session
}

func (a *agentEnv) last() tunnel.Session {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.sessions) == 0 {
		return nil
	}
	return a.sessions[len(a.sessions)-1]
}

// setupAgent starts an Auto client for cn whose grpc server answers
// "agent:<cn>:<payload>".
func setupAgent(t testing.TB, e *cpEnv, cn string, mod func(*tunnel.ClientConfig)) *agentEnv {
	t.Helper()
	ctls, err := e.ca.ClientTLS(cn)
	if err != nil {
		t.Fatal(err)
	}
	a := &agentEnv{gs: grpc.NewServer(), reg: prometheus.NewRegistry()}
	tunneltest.RegisterEcho(a.gs, func(_ context.Context, in []byte) ([]byte, error) {
		return []byte("agent:" + cn + ":" + string(in)), nil
	})
	m, err := tunnel.NewMetrics(a.reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := tunnel.ClientConfig{
		Addrs: []string{e.addr}, TLS: ctls, Liveness: fast,
		BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		Proxy:   func(string) (*url.URL, error) { return nil, nil },
		Logger:  testLogger(t),
		Metrics: m,
	}
	if mod != nil {
		mod(&cfg)
	}
	a.auto, err = tunnel.NewAuto(cfg, func(ctx context.Context, s tunnel.Session) {
		a.mu.Lock()
		a.sessions = append(a.sessions, s)
		a.mu.Unlock()
		tunnel.ServeGRPC(ctx, s, a.gs)
	})
	if err != nil {
		t.Fatal(err)
	}
	a.cc, err = tunnel.NewClientConn("controlplane", a.auto.OpenStream, tunnel.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.auto.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.cc.Close()
		a.auto.Stop()
		a.gs.Stop()
	})
	return a
}

// push calls the agent's echo through the hub, with a deadline.
func (e *cpEnv) push(ctx context.Context, identity, msg string) (string, error) {
	cc, err := e.hub.Conn(identity)
	if err != nil {
		return "", err
	}
	out, err := tunneltest.Echo(ctx, cc, []byte(msg))
	return string(out), err
}

// waitPush retries a push until it works (the agent may still be connecting).
func (e *cpEnv) waitPush(t testing.TB, d time.Duration, identity, msg string) {
	t.Helper()
	want := "agent:" + identity + ":" + msg
	var last error
	testenv.Eventually(t, d, "push to "+identity, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		got, err := e.push(ctx, identity, msg)
		last = err
		if err == nil && got != want {
			t.Fatalf("push answer %q, want %q", got, want)
		}
		return err == nil
	})
	_ = last
}
