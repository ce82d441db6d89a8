package sdk

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

var env *controlplanetest.Env

func TestMain(m *testing.M) { os.Exit(controlplanetest.Main(m, &env)) }

// realBundle is a real controlplane (private Postgres and Redis), reached
// by the client through a relay the test can cut or repoint, with an admin
// token.
type realBundle struct {
	cfg   *config.Config
	in    *controlplanetest.Instance
	relay *relay
	token string
	admin context.Context
}

// startReal starts a controlplane that gives up on a silent machine after
// grace.
func startReal(t *testing.T, grace string) *realBundle {
	t.Helper()
	cfg := env.Config(t)
	cfg.Controlplane.LostAgentGrace = grace
	cfg.Worker.DefaultImage = "busybox:sdktest"
	controlplanetest.StandInAgent(t, cfg)
	in := controlplanetest.Start(t, cfg, true)
	resp, err := v1.NewAuthServiceClient(in.Conn).Authorize(metadata.AppendToOutgoingContext(context.Background(), "x-levers9-bootstrap-secret", "test-bootstrap-secret-0123456789abcdef"), &v1.AuthorizeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	controlplanetest.WaitTunnelEndpoint(t, in)
	r := startRelay(t, in.Server.GRPCAddr())
	return &realBundle{cfg: cfg, in: in, relay: r, token: resp.Token,
		admin: metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+resp.Token)}
}

// client is an SDK client configured through the environment, as a
// program run next to the CLI would be.
func (b *realBundle) client(t *testing.T, opts ...Option) *Client {
	t.Helper()
	env := map[string]string{"LEVERS9_CONTROLPLANE": b.relay.addr, "LEVERS9_TOKEN": b.token, "LEVERS9_HOME": t.TempDir()}
	c, err := NewClient(context.Background(), append([]Option{WithGetenv(func(k string) string { return env[k] }), withBackoffForTest(20 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// restart stops the controlplane and starts another on the same database,
// Redis and tunnel port; the relay points at it.
func (b *realBundle) restart(t *testing.T) {
	t.Helper()
	b.in.Server.Stop()
	b.in = controlplanetest.Start(t, b.cfg, true)
	controlplanetest.WaitTunnelEndpoint(t, b.in)
	b.relay.setTarget(b.in.Server.GRPCAddr())
}

// relay forwards TCP to the controlplane; cut drops every connection, as
// a network blip or a controlplane crash does.
type relay struct {
	addr string
	// mu guards target and conns.
	mu     sync.Mutex
	target string
	conns  map[net.Conn]bool
}

func startRelay(t *testing.T, target string) *relay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: ln.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); r.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			target := r.target
			r.mu.Unlock()
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns[c], r.conns[up] = true, true
			r.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	return r
}

func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
}

func (r *relay) setTarget(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.target = addr
}
