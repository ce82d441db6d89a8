package tunnel_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/tunnel"
	"github.com/levers9/levers9/tunnel/tunneltest"
)

func setupNetnsCP(t *testing.T, live tunnel.Liveness) (*nsPair, *cpEnv) {
	p := setupNetns(t)
	e := setupCP(t, cpOpts{addr: p.addr("0"), live: live, startFn: p.serverStart})
	return p, e
}

func TestNetnsUDPBlockedFallsBackToTCPAndMovesBack(t *testing.T) {
	t.Parallel()
	p, e := setupNetnsCP(t, fast)
	// A middlebox that silently drops UDP towards the controlplane.
	p.iptables(t, p.srv, "-A", "INPUT", "-p", "udp", "-j", "DROP")
	a := agentOnTCP(t, p, e, "m-udp", time.Second)

	p.iptables(t, p.srv, "-D", "INPUT", "-p", "udp", "-j", "DROP")
	testenv.Eventually(t, 10*time.Second, "agent back on QUIC", func() bool {
		s := a.last()
		return s != nil && s.Transport() == tunnel.TransportQUIC && s.Err() == nil
	})
	testenv.Eventually(t, 5*time.Second, "hub sees QUIC", func() bool {
		ag := e.hub.Agents()
		return len(ag) == 1 && ag[0].Transport == tunnel.TransportQUIC
	})
	e.waitPush(t, 2*time.Second, "m-udp", "over quic")
}

func TestNetnsRPCsCompleteUnder5PercentLoss(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			live := tunnel.Liveness{HeartbeatInterval: 500 * time.Millisecond, HeartbeatTimeout: 5 * time.Second, HandshakeTimeout: 5 * time.Second}
			p, e := setupNetnsCP(t, live)
			a := setupAgent(t, e, "m-loss", func(c *tunnel.ClientConfig) { tr.mod(c); p.clientSockets(c); c.Liveness = live })
			e.waitPush(t, 10*time.Second, "m-loss", "x")
			// 5% loss each way, on the wire (INPUT of the receiving side).
			p.both(t, "-A", "INPUT", "-m", "statistic", "--mode", "random", "--probability", "0.05", "-j", "DROP")
			payload := strings.Repeat("t", 32<<10)
			var wg sync.WaitGroup
			errs := make(chan error, 200)
			for i := range 40 {
				wg.Add(2)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					got, err := e.push(ctx, "m-loss", payload)
					if err == nil && got != "agent:m-loss:"+payload {
						err = errBadAnswer
					}
					if err != nil {
						errs <- err
					}
				}()
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if _, err := tunneltest.Echo(ctx, a.cc, []byte(payload)); err != nil {
						errs <- err
					}
				}()
				if i%10 == 9 {
					wg.Wait()
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("RPC under 5%% loss: %v", err)
			}
		})
	}
}

var errBadAnswer = net.UnknownNetworkError("bad echo answer")

// The default liveness settings (3 s heartbeats, 12 s timeout) detect an
// iptables DROP blackhole within 15 s on both sides.
func TestNetnsBlackholeDetectedAtDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 15 s")
	}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			var def tunnel.Liveness
			def = def.WithDefaults()
			p, e := setupNetnsCP(t, def)
			a := setupAgent(t, e, "m-dead", func(c *tunnel.ClientConfig) {
				tr.mod(c)
				p.clientSockets(c)
				c.Liveness = tunnel.Liveness{}
				c.BackoffBase, c.BackoffMax = time.Minute, time.Minute
			})
			e.waitPush(t, 10*time.Second, "m-dead", "x")
			s := a.last()
			p.both(t, "-A", "INPUT", "-j", "DROP")
			start := time.Now()
			pushErr := make(chan error, 1)
			go func() {
				_, err := e.push(context.Background(), "m-dead", "into the void")
				pushErr <- err
			}()
			const limit = 15 * time.Second
			testenv.Eventually(t, limit, "agent detects the blackhole", func() bool { return s.Err() != nil })
			t.Logf("agent detected after %s: %v", time.Since(start), s.Err())
			testenv.Eventually(t, limit-time.Since(start), "controlplane detects the blackhole", func() bool { return e.srv.SessionsForTest() == 0 })
			t.Logf("controlplane detected after %s", time.Since(start))
			select {
			case err := <-pushErr:
				if err == nil {
					t.Fatal("push into the blackhole succeeded")
				}
			case <-time.After(limit - time.Since(start)):
				t.Fatal("push into the blackhole still hanging at 15 s")
			}
		})
	}
}

// A host firewall that drops some of the QUIC datagrams on their way out
// (OUTPUT: sendmsg fails with EPERM, as it does when the conntrack table is
// full) loses packets; it must not end the session. Both sides drop.
func TestNetnsSessionSurvivesRefusedSends(t *testing.T) {
	t.Parallel()
	live := tunnel.Liveness{HeartbeatInterval: 500 * time.Millisecond, HeartbeatTimeout: 5 * time.Second, HandshakeTimeout: 5 * time.Second}
	p, e := setupNetnsCP(t, live)
	a := setupAgent(t, e, "m-eperm", func(c *tunnel.ClientConfig) { c.DisableTCP = true; p.clientSockets(c); c.Liveness = live })
	e.waitPush(t, 10*time.Second, "m-eperm", "x")
	s := a.last()
	p.both(t, "-A", "OUTPUT", "-p", "udp", "-m", "statistic", "--mode", "random", "--probability", "0.1", "-j", "DROP")
	payload := strings.Repeat("e", 16<<10)
	for i := range 30 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := e.push(ctx, "m-eperm", payload)
		if err == nil && got != "agent:m-eperm:"+payload {
			err = errBadAnswer
		}
		if err == nil {
			_, err = tunneltest.Echo(ctx, a.cc, []byte(payload))
		}
		cancel()
		if err != nil {
			t.Fatalf("round %d under refused sends: %v", i, err)
		}
	}
	if a.last() != s || s.Err() != nil {
		t.Fatalf("the session ended under refused sends (err %v); it should have lost packets only", s.Err())
	}
	if n := counterOf(t, a, "levers9_tunnel_udp_sends_refused_total"); n == 0 {
		t.Error("the agent counted no refused sends under a 10% OUTPUT drop")
	}
	if n := e.counter("levers9_tunnel_udp_sends_refused_total", "side", "server"); n == 0 {
		t.Error("the server counted no refused sends under a 10% OUTPUT drop")
	}
}

// A host that refuses every UDP send (OUTPUT DROP) before the first session
// fails the QUIC dial at once: the agent is on TCP well within the race.
func TestNetnsUDPRefusedLocallyFallsBackToTCP(t *testing.T) {
	t.Parallel()
	p, e := setupNetnsCP(t, fast)
	p.iptables(t, p.cli, "-A", "OUTPUT", "-p", "udp", "-j", "DROP")
	agentOnTCP(t, p, e, "m-noudp", 0)
}

// agentOnTCP starts agent cn in p's client namespace with the race's
// defaults (so the 10 s bound is the real one) and waits until it is on TCP
// and answers a push there.
func agentOnTCP(t *testing.T, p *nsPair, e *cpEnv, cn string, reprobe time.Duration) *agentEnv {
	t.Helper()
	start := time.Now()
	a := setupAgent(t, e, cn, func(c *tunnel.ClientConfig) {
		p.clientSockets(c)
		c.QUICHeadStart, c.DialTimeout = 0, 0
		c.ReprobeInterval = reprobe
	})
	testenv.Eventually(t, 10*time.Second, "agent on TCP", func() bool {
		s := a.last()
		return s != nil && s.Transport() == tunnel.TransportTCP
	})
	t.Logf("%s on TCP after %s", cn, time.Since(start))
	e.waitPush(t, 2*time.Second, cn, "over tcp")
	return a
}
