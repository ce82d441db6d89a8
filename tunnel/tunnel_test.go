package tunnel_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/tunnel"
	"github.com/levers9/levers9/tunnel/tunneltest"
)

var transports = []struct {
	name string
	want tunnel.Transport
	mod  func(*tunnel.ClientConfig)
}{
	{"quic", tunnel.TransportQUIC, func(c *tunnel.ClientConfig) { c.DisableTCP = true }},
	{"tcp", tunnel.TransportTCP, func(c *tunnel.ClientConfig) { c.DisableQUIC = true }},
}

func TestGRPCBothWays(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			e := setupCP(t, cpOpts{})
			a := setupAgent(t, e, "m-"+tr.name, tr.mod)
			e.waitPush(t, 5*time.Second, "m-"+tr.name, "run task")

			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			got, err := tunneltest.Echo(ctx, a.cc, []byte("status"))
			if err != nil {
				t.Fatalf("agent -> controlplane call: %v", err)
			}
			if want := "cp:m-" + tr.name + ":status"; string(got) != want {
				t.Fatalf("controlplane answered %q, want %q", got, want)
			}
			if s := a.last(); s.Transport() != tr.want {
				t.Fatalf("transport %s, want %s", s.Transport(), tr.want)
			}
			ag := e.hub.Agents()
			if len(ag) != 1 || ag[0].Transport != tr.want || ag[0].Identity != "m-"+tr.name {
				t.Fatalf("hub agents %+v", ag)
			}
			if got := e.counter("levers9_tunnel_sessions", "side", "server", "transport", string(tr.want)); got != 1 {
				t.Fatalf("server sessions gauge %v, want 1", got)
			}
			if got := e.counter("levers9_tunnel_stream_bytes_total", "side", "server"); got == 0 {
				t.Fatal("no bytes counted")
			}
		})
	}
}

func TestRaceQUICWinsAndLoserIsClosed(t *testing.T) {
	e := setupCP(t, cpOpts{})
	a := setupAgent(t, e, "m-race", func(c *tunnel.ClientConfig) { c.QUICHeadStart = time.Millisecond })
	e.waitPush(t, 5*time.Second, "m-race", "x")
	// Whichever won, the server admitted exactly one session: the loser
	// never got past TLS.
	testenv.Eventually(t, 3*time.Second, "one session", func() bool { return e.srv.SessionsForTest() == 1 })
	if a.last() == nil {
		t.Fatal("no session")
	}
}

func TestRefusedCertificates(t *testing.T) {
	e := setupCP(t, cpOpts{})
	e.revoked.Store("m-revoked", true)
	otherCA, err := tunneltest.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	cases := []struct {
		name      string
		ca        *tunneltest.CA
		cn        string
		from, to  time.Time
		permanent bool // refused by the authorizer (else by TLS)
	}{
		{"revoked", e.ca, "m-revoked", now.Add(-time.Hour), now.Add(time.Hour), true},
		{"unknown", e.ca, "unknown-7", now.Add(-time.Hour), now.Add(time.Hour), true},
		{"expired", e.ca, "m-expired", now.Add(-2 * time.Hour), now.Add(-time.Hour), false},
		{"other CA", otherCA, "m-other", now.Add(-time.Hour), now.Add(time.Hour), false},
	}
	for _, tc := range cases {
		for _, tr := range transports {
			t.Run(tc.name+"/"+tr.name, func(t *testing.T) {
				cert, err := tc.ca.Issue(tc.cn, false, tc.from, tc.to)
				if err != nil {
					t.Fatal(err)
				}
				ctls, _ := e.ca.ClientTLS("unused")
				ctls.Certificates[0] = cert
				cfg := tunnel.ClientConfig{Addrs: []string{e.addr}, TLS: ctls, Liveness: fast, Proxy: noProxy}
				tr.mod(&cfg)
				d, err := tunnel.NewDirect(cfg)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				s, err := d.Dial(ctx, tunnel.DialRace)
				if err == nil {
					_ = s.Close()
					t.Fatal("dial succeeded, want refusal")
				}
				var r *tunnel.RefusedError
				if tc.permanent {
					if !errors.As(err, &r) || !r.Permanent || !errdefs.IsPermissionDenied(err) || errdefs.IsRetryable(err) {
						t.Fatalf("want a permanent refusal, got %v", err)
					}
				} else if errors.As(err, &r) {
					t.Fatalf("want a TLS failure, got refusal %v", err)
				}
				if n := e.srv.SessionsForTest(); n != 0 {
					t.Fatalf("%d sessions admitted", n)
				}
			})
		}
	}
	if got := e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "refused"); got != 4 {
		t.Fatalf("refused handshakes %v, want 4", got)
	}
	if got := e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "ok"); got != 0 {
		t.Fatalf("ok handshakes %v, want 0", got)
	}
}

func noProxy(string) (*url.URL, error) { return nil, nil }

func TestAdmissionLimitRefusesWithRetryAfter(t *testing.T) {
	e := setupCP(t, cpOpts{rate: 5, burst: 2})
	ctls, err := e.ca.ClientTLS("m-adm")
	if err != nil {
		t.Fatal(err)
	}
	d, err := tunnel.NewDirect(tunnel.ClientConfig{Addrs: []string{e.addr}, TLS: ctls, Liveness: fast, Proxy: noProxy, DisableQUIC: true})
	if err != nil {
		t.Fatal(err)
	}
	var hints []time.Duration
	admitted := 0
	for range 6 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := d.Dial(ctx, tunnel.DialRace)
		cancel()
		if err == nil {
			admitted++
			_ = s.Close()
			continue
		}
		ra, ok := tunnel.RetryAfterOf(err)
		if !ok || !errdefs.IsRetryable(err) {
			t.Fatalf("refusal without retry-after: %v", err)
		}
		hints = append(hints, ra)
	}
	if admitted < 2 || len(hints) == 0 {
		t.Fatalf("admitted %d, refused %d: want the burst admitted and the rest refused", admitted, len(hints))
	}
	for i := 1; i < len(hints); i++ {
		if hints[i] <= hints[i-1] {
			t.Fatalf("retry-after hints %v do not spread refused agents out", hints)
		}
	}
	// Auto clients honour the hint and all get in.
	const n = 8
	for i := range n {
		setupAgent(t, e, "m-adm-"+string(rune('a'+i)), nil)
	}
	testenv.Eventually(t, 10*time.Second, "all agents admitted", func() bool { return len(e.hub.Agents()) == n })
}

func TestServerRestartAgentReconnects(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			e := setupCP(t, cpOpts{})
			a := setupAgent(t, e, "m-restart", tr.mod)
			e.waitPush(t, 5*time.Second, "m-restart", "before")
			first := a.last()
			e.srv.Stop()
			// A new controlplane process on the same port and CA.
			e2 := setupCP(t, cpOpts{addr: e.addr, ca: e.ca})
			e2.waitPush(t, 10*time.Second, "m-restart", "after")
			if a.last() == first {
				t.Fatal("agent kept its old session")
			}
			if got := counterOf(t, a, "levers9_tunnel_reconnects_total"); got < 1 {
				t.Fatalf("reconnects %v, want >= 1", got)
			}
		})
	}
}

func counterOf(t testing.TB, a *agentEnv, name string) float64 {
	e := &cpEnv{reg: a.reg}
	return e.counter(name)
}

func TestBlackholeDetectedByBothSides(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			e := setupCP(t, cpOpts{})
			r := newRelay(t, e.addr, 0)
			a := setupAgent(t, e, "m-bh", func(c *tunnel.ClientConfig) {
				tr.mod(c)
				c.Addrs = []string{r.addr}
				c.BackoffBase = 10 * time.Second // stay down once detected
				c.BackoffMax = 10 * time.Second
			})
			e.waitPush(t, 5*time.Second, "m-bh", "x")
			s := a.last()
			r.blackhole.Store(true)
			start := time.Now()
			// A push into the blackhole fails instead of hanging.
			_, perr := e.push(context.Background(), "m-bh", "lost")
			pushTook := time.Since(start)
			limit := fast.HeartbeatTimeout + fast.HeartbeatInterval*3
			testenv.Eventually(t, 2*limit, "agent notices", func() bool {
				select {
				case <-s.Done():
					return true
				default:
					return false
				}
			})
			agentTook := time.Since(start)
			testenv.Eventually(t, 2*limit, "server notices", func() bool { return e.srv.SessionsForTest() == 0 })
			serverTook := time.Since(start)
			if perr == nil {
				t.Fatal("push into a blackhole succeeded")
			}
			if !errors.Is(s.Err(), tunnel.ErrPeerDead) && !strings.Contains(s.Err().Error(), "timeout") {
				t.Logf("agent session ended with %v", s.Err())
			}
			for what, d := range map[string]time.Duration{"push": pushTook, "agent": agentTook, "server": serverTook} {
				if d > limit {
					t.Errorf("%s took %s to notice, limit %s", what, d, limit)
				}
			}
		})
	}
}

// TestQuietSessionReplaced: when the controlplane's side of a session goes
// silent (it restarted and its reset never arrived) but new connections
// work, the agent moves to a new session after about two heartbeat
// intervals instead of waiting out the heartbeat timeout.
func TestQuietSessionReplaced(t *testing.T) {
	live := tunnel.Liveness{HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: 5 * time.Second, HandshakeTimeout: 2 * time.Second}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			e := setupCP(t, cpOpts{live: live})
			r := newRelay(t, e.addr, 0)
			a := setupAgent(t, e, "m-quiet", func(c *tunnel.ClientConfig) {
				tr.mod(c)
				c.Addrs = []string{r.addr}
				c.Liveness = live
				c.BackoffBase = 10 * time.Second // the slow path would show
				c.BackoffMax = 10 * time.Second
			})
			e.waitPush(t, 5*time.Second, "m-quiet", "x")
			old := a.last()
			r.freeze()
			start := time.Now()
			testenv.Eventually(t, live.HeartbeatTimeout, "a new session", func() bool { return a.last() != old })
			took := time.Since(start)
			// The agent closes the old session once the new one is up, but
			// the controlplane, registering the new one, may close the old
			// one first (an EOF through the relay): either is the quiet
			// path. The slow path would end it on missed heartbeats.
			testenv.Eventually(t, live.HeartbeatTimeout, "the old session ended", func() bool { return old.Err() != nil })
			if errors.Is(old.Err(), tunnel.ErrPeerDead) {
				t.Fatalf("old session ended with %v, want closed for its replacement", old.Err())
			}
			// Quiet after 2.5 intervals, a dial after at most half an
			// interval more: far below the timeout.
			if took >= live.HeartbeatTimeout-time.Second {
				t.Fatalf("moved after %s, not before the heartbeat timeout %s", took, live.HeartbeatTimeout)
			}
			e.waitPush(t, 5*time.Second, "m-quiet", "after")
			t.Logf("moved to a new session %s after the old one went quiet", took.Round(time.Millisecond))
		})
	}
}

func TestIdleTunnelSurvivesNATExpiry(t *testing.T) {
	// The relay forgets flows idle for 1 s (a 30 s UDP NAT scaled by 1/30);
	// heartbeats every 100 ms keep them warm.
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			e := setupCP(t, cpOpts{})
			r := newRelay(t, e.addr, time.Second)
			a := setupAgent(t, e, "m-idle", func(c *tunnel.ClientConfig) { tr.mod(c); c.Addrs = []string{r.addr} })
			e.waitPush(t, 5*time.Second, "m-idle", "x")
			s := a.last()
			deadline := time.Now().Add(3500 * time.Millisecond)
			testenv.Eventually(t, 5*time.Second, "idle period", func() bool { return time.Now().After(deadline) })
			if got := r.expired.Load(); got != 0 {
				t.Fatalf("relay expired %d idle flows", got)
			}
			if s.Err() != nil || a.last() != s {
				t.Fatalf("idle session broke: %v", s.Err())
			}
			e.waitPush(t, time.Second, "m-idle", "still there")
		})
	}
	// Control: heartbeats slower than the relay's idle timeout do lose the
	// flow, so the relay really expires idle flows.
	t.Run("control", func(t *testing.T) {
		t.Parallel()
		slow := tunnel.Liveness{HeartbeatInterval: 1500 * time.Millisecond, HeartbeatTimeout: 4 * time.Second, HandshakeTimeout: time.Second}
		e := setupCP(t, cpOpts{live: slow})
		r := newRelay(t, e.addr, time.Second)
		setupAgent(t, e, "m-idle", func(c *tunnel.ClientConfig) { c.DisableQUIC = true; c.Addrs = []string{r.addr}; c.Liveness = slow })
		e.waitPush(t, 5*time.Second, "m-idle", "x")
		testenv.Eventually(t, 5*time.Second, "relay expires the flow", func() bool { return r.expired.Load() > 0 })
	})
}

// openSignal closes opened once a stream is open on the ClientConn (the
// push ClientConn counts it as in flight from then on) and sent once the
// first message has gone, so a test that cancels after sent knows the
// stream carried data whatever the scheduler did.
type openSignal struct {
	*grpc.ClientConn
	opened chan struct{}
	sent   chan struct{}
}

func (c openSignal) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	st, err := c.ClientConn.NewStream(ctx, desc, method, opts...)
	close(c.opened)
	if err != nil {
		return st, err
	}
	return &sentSignalStream{ClientStream: st, sent: c.sent}, nil
}

type sentSignalStream struct {
	grpc.ClientStream
	sent chan struct{}
	once sync.Once
}

func (s *sentSignalStream) SendMsg(m any) error {
	err := s.ClientStream.SendMsg(m)
	if err == nil {
		s.once.Do(func() { close(s.sent) })
	}
	return err
}

func TestHubPushConnClosesWhenIdleAndEndsWithTheSession(t *testing.T) {
	const idle = 300 * time.Millisecond
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e := setupCP(t, cpOpts{pushIdle: idle, hubClock: clk})
	a := setupAgent(t, e, "m-lazy", nil)
	e.waitPush(t, 5*time.Second, "m-lazy", "first")
	ag, ok := e.hub.Agent("m-lazy")
	if !ok {
		t.Fatal("agent not in the hub")
	}
	cc1, err := ag.Conn()
	if err != nil {
		t.Fatal(err)
	}
	if cc2, err := e.hub.Conn("m-lazy"); err != nil || cc1 != cc2 {
		t.Fatalf("second Conn: %p %v, want the same ClientConn %p", cc2, err, cc1)
	}
	// A stream in flight for several idle periods keeps the ClientConn:
	// each period the reaper looks and arms itself again.
	ctx, cancel := context.WithCancel(context.Background())
	sig := openSignal{ClientConn: cc1, opened: make(chan struct{}), sent: make(chan struct{})}
	type sunk struct {
		n   int64
		err error
	}
	sinkDone := make(chan sunk, 1)
	go func() {
		n, err := tunneltest.Sink(ctx, sig, make([]byte, 1024))
		sinkDone <- sunk{n, err}
	}()
	<-sig.opened
	for range 4 {
		clk.Advance(idle)
		if !clk.BlockUntil(t.Context().Done(), 1) {
			t.Fatal("the reaper did not arm itself again")
		}
	}
	select {
	case <-sig.sent:
	case r := <-sinkDone:
		t.Fatalf("sink ended before sending: %d bytes, %v", r.n, r.err)
	}
	cancel()
	if r := <-sinkDone; r.n == 0 {
		t.Fatalf("sink sent nothing: %v", r.err)
	}
	if cc1.GetState() == connectivity.Shutdown {
		t.Fatal("push ClientConn closed under a stream in flight")
	}
	// Idle for longer than the timeout: closed; the next push makes a new one.
	testenv.Eventually(t, 5*time.Second, "idle push ClientConn closed", func() bool {
		clk.Advance(idle)
		return cc1.GetState() == connectivity.Shutdown
	})
	e.waitPush(t, 5*time.Second, "m-lazy", "again")
	if cc3, err := ag.Conn(); err != nil || cc3 == cc1 {
		t.Fatalf("Conn after the idle close: %p %v, want a new ClientConn", cc3, err)
	}
	a.auto.Stop()
	testenv.Eventually(t, 5*time.Second, "agent gone from the hub", func() bool {
		_, ok := e.hub.Agent("m-lazy")
		return !ok
	})
	if _, err := ag.Conn(); !errors.Is(err, tunnel.ErrAgentNotConnected) {
		t.Fatalf("Conn after the session ended: %v, want ErrAgentNotConnected", err)
	}
}
