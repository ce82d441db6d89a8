package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/tunnel/tunneltest"
)

// agentEnd is the client's end of a session under test, driven by hand.
type agentEnd struct {
	ctrl  net.Conn
	close func() // closes the connection
}

// sessionPair is a server session over a real connection of the given
// transport on loopback, and the client's end of it.
func sessionPair(t *testing.T, tr Transport, live Liveness) (*session, agentEnd) {
	t.Helper()
	ca, err := tunneltest.NewCA("hb")
	if err != nil {
		t.Fatal(err)
	}
	stls, err := ca.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	ctls, err := ca.ClientTLS("agent-hb")
	if err != nil {
		t.Fatal(err)
	}
	stls.NextProtos, ctls.NextProtos, ctls.ServerName = []string{ALPN}, []string{ALPN}, "localhost"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var (
		sm     mux
		cm     mux
		hangUp func()
	)
	switch tr {
	case TransportQUIC:
		// QUIC's own idle timeout far off: silence must be caught by the
		// session's heartbeat check, not by QUIC.
		qc := &quic.Config{MaxIdleTimeout: time.Minute}
		ln, err := quic.ListenAddr("127.0.0.1:0", stls, qc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		cc, err := quic.DialAddr(ctx, ln.Addr().String(), ctls, qc)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sm, cm = &quicMux{c: sc}, &quicMux{c: cc}
		hangUp = func() { _ = cc.CloseWithError(7, "agent stopping") }
	case TransportTCP:
		ln, err := tls.Listen("tcp", "127.0.0.1:0", stls)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		accepted := make(chan *tls.Conn, 1)
		go func() {
			defer close(accepted)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// Both ends handshake at once.
			if tc := c.(*tls.Conn); tc.HandshakeContext(ctx) == nil {
				accepted <- tc
			}
		}()
		cc, err := tls.Dial("tcp", ln.Addr().String(), ctls)
		if err != nil {
			t.Fatal(err)
		}
		sc, ok := <-accepted
		if !ok {
			t.Fatal("server side of the TLS connection failed")
		}
		if sm, err = newYamux(sc, true, live, Limits{}.WithDefaults(), slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		if cm, err = newYamux(cc, false, live, Limits{}.WithDefaults(), slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		hangUp = func() { _ = cm.closeWith("agent stopping") }
	}
	t.Cleanup(func() { _ = cm.closeWith("test over") })
	cs, err := cm.open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A stream reaches the peer with its first bytes.
	if _, err := cs.Write(heartbeat[:]); err != nil {
		t.Fatal(err)
	}
	ss, err := sm.accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(sm, "server", "agent-hb", ss, live, Limits{}.WithDefaults(), slog.New(slog.NewTextHandler(t.Output(), nil)), m, clock.Real())
	t.Cleanup(func() { _ = s.Close() })
	return s, agentEnd{ctrl: cs, close: hangUp}
}

// TestServerSessionHeartbeats: the server's side of a session reads the
// agent's heartbeats at its own beats (no reader goroutine per agent), so
// it must still keep a beating agent, drop a silent or garbled one, and
// end when the connection closes: QUIC at once, yamux by the next beat.
func TestServerSessionHeartbeats(t *testing.T) {
	live := Liveness{HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: 300 * time.Millisecond, HandshakeTimeout: time.Second}
	for _, tr := range []Transport{TransportQUIC, TransportTCP} {
		for _, tc := range []struct {
			name string
			// agent drives the client's end until stop closes.
			agent func(a agentEnd, stop <-chan struct{})
			// wantErr is in the session's error; "" means the session
			// stays up.
			wantErr string
			// within bounds how long the session may take to end.
			within time.Duration
		}{
			{name: "beating agent stays", agent: func(a agentEnd, stop <-chan struct{}) {
				for {
					select {
					case <-stop:
						return
					case <-time.After(live.HeartbeatInterval):
						_, _ = a.ctrl.Write(heartbeat[:])
					}
				}
			}},
			{name: "silent agent dropped", agent: func(agentEnd, <-chan struct{}) {},
				wantErr: ErrPeerDead.Error(), within: live.HeartbeatTimeout + 3*live.HeartbeatInterval},
			{name: "garbage on the control stream", agent: func(a agentEnd, _ <-chan struct{}) {
				_, _ = a.ctrl.Write([]byte("x"))
			}, wantErr: "unexpected byte 0x78", within: 3 * live.HeartbeatInterval},
			{name: "closed connection", agent: func(a agentEnd, _ <-chan struct{}) { a.close() },
				wantErr: map[Transport]string{TransportQUIC: "agent stopping", TransportTCP: "writing heartbeat"}[tr],
				// QUIC: well before a beat would notice.
				within: map[Transport]time.Duration{TransportQUIC: live.HeartbeatInterval / 2, TransportTCP: 3 * live.HeartbeatInterval}[tr]},
		} {
			t.Run(string(tr)+"/"+tc.name, func(t *testing.T) {
				s, a := sessionPair(t, tr, live)
				if !s.polled {
					t.Fatal("the server's side of a session reads heartbeats from a goroutine")
				}
				stop := make(chan struct{})
				start := time.Now()
				done := make(chan struct{})
				go func() { defer close(done); tc.agent(a, stop) }()
				defer func() { close(stop); <-done }()
				if tc.wantErr == "" {
					select {
					case <-s.Done():
						t.Fatalf("session with a beating agent ended: %v", s.Err())
					case <-time.After(3 * live.HeartbeatTimeout):
					}
					return
				}
				select {
				case <-s.Done():
				case <-time.After(tc.within + time.Second):
					t.Fatalf("session still up after %s", time.Since(start))
				}
				took := time.Since(start)
				if err := s.Err(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("session ended with %v, want %q", err, tc.wantErr)
				}
				if tc.wantErr == ErrPeerDead.Error() && !errors.Is(s.Err(), ErrPeerDead) {
					t.Fatalf("session ended with %v, not ErrPeerDead", s.Err())
				}
				if took > tc.within {
					t.Fatalf("session took %s to end, want within %s", took, tc.within)
				}
			})
		}
	}
}
