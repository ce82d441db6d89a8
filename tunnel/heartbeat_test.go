package tunnel

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/tunnel/tunneltest"
)

// quicSessionPair is a server session over a real QUIC connection on
// loopback, and the client's end of it (the connection and its control
// stream) for the test to drive by hand.
func quicSessionPair(t *testing.T, live Liveness) (*session, *quic.Conn, *quic.Stream) {
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
	// QUIC's own idle timeout far off: silence must be caught by the
	// session's heartbeat check, not by QUIC.
	qc := &quic.Config{MaxIdleTimeout: time.Minute}
	ln, err := quic.ListenAddr("127.0.0.1:0", stls, qc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := quic.DialAddr(ctx, ln.Addr().String(), ctls, qc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.CloseWithError(0, "test over") })
	sc, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := cc.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A stream reaches the peer with its first bytes.
	if _, err := cs.Write(heartbeat[:]); err != nil {
		t.Fatal(err)
	}
	ss, err := sc.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(&quicMux{c: sc}, "server", "agent-hb", &quicStream{Stream: ss, c: sc}, live, Limits{}.WithDefaults(), slog.New(slog.NewTextHandler(t.Output(), nil)), m, clock.Real())
	t.Cleanup(func() { _ = s.Close() })
	return s, cc, cs
}

// TestServerQUICSessionHeartbeats: the server's side of a QUIC session reads
// the agent's heartbeats at its own beats (no reader goroutine), so it must
// still keep a beating agent, drop a silent or garbled one, and end at once
// when the connection closes.
func TestServerQUICSessionHeartbeats(t *testing.T) {
	live := Liveness{HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: 300 * time.Millisecond, HandshakeTimeout: time.Second}
	for _, tc := range []struct {
		name string
		// agent drives the client's end until stop closes.
		agent func(cc *quic.Conn, cs *quic.Stream, stop <-chan struct{})
		// wantErr is in the session's error; "" means the session stays up.
		wantErr string
		// within bounds how long the session may take to end.
		within time.Duration
	}{
		{name: "beating agent stays", agent: func(_ *quic.Conn, cs *quic.Stream, stop <-chan struct{}) {
			for {
				select {
				case <-stop:
					return
				case <-time.After(live.HeartbeatInterval):
					_, _ = cs.Write(heartbeat[:])
				}
			}
		}},
		{name: "silent agent dropped", agent: func(*quic.Conn, *quic.Stream, <-chan struct{}) {},
			wantErr: ErrPeerDead.Error(), within: live.HeartbeatTimeout + 3*live.HeartbeatInterval},
		{name: "garbage on the control stream", agent: func(_ *quic.Conn, cs *quic.Stream, _ <-chan struct{}) {
			_, _ = cs.Write([]byte("x"))
		}, wantErr: "unexpected byte 0x78", within: 3 * live.HeartbeatInterval},
		// Well before a beat would notice: the connection's context says so.
		{name: "closed connection", agent: func(cc *quic.Conn, _ *quic.Stream, _ <-chan struct{}) {
			_ = cc.CloseWithError(7, "agent stopping")
		}, wantErr: "agent stopping", within: live.HeartbeatInterval / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, cc, cs := quicSessionPair(t, live)
			if !s.polled {
				t.Fatal("the server's side of a QUIC session reads heartbeats from a goroutine")
			}
			stop := make(chan struct{})
			start := time.Now()
			done := make(chan struct{})
			go func() { defer close(done); tc.agent(cc, cs, stop) }()
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
