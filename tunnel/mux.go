package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"

	"github.com/hashicorp/yamux"
	"github.com/quic-go/quic-go"
)

// mux is the raw multiplexer under a session: a QUIC connection or a yamux
// session over TLS.
type mux interface {
	open(ctx context.Context) (net.Conn, error)
	accept(ctx context.Context) (net.Conn, error)
	closeWith(reason string) error
	done() <-chan struct{}
	tlsState() tls.ConnectionState
	transport() Transport
	localAddr() net.Addr
	remoteAddr() net.Addr
}

func peerCert(st tls.ConnectionState) *x509.Certificate {
	if len(st.PeerCertificates) == 0 {
		return nil
	}
	return st.PeerCertificates[0]
}

// --- QUIC ---

type quicMux struct {
	c *quic.Conn
	// tr is owned by the client side (one UDP socket per dial) and closed
	// with the connection; nil on the server.
	tr *quic.Transport
}

func quicConfig(l Liveness, lim Limits) *quic.Config {
	return &quic.Config{
		HandshakeIdleTimeout: l.HandshakeTimeout,
		// The heartbeat decides liveness and keeps NAT bindings warm; the
		// QUIC idle timeout is a backstop. No QUIC keep-alive: it would add
		// PINGs (and their ACKs) beside the heartbeats of every idle agent.
		MaxIdleTimeout:        l.HeartbeatTimeout + l.HeartbeatInterval,
		MaxIncomingStreams:    int64(lim.MaxStreams) + 1, // +1: control stream
		MaxIncomingUniStreams: -1,
	}
}

func (m *quicMux) open(ctx context.Context) (net.Conn, error) {
	s, err := m.c.OpenStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	return &quicStream{Stream: s, c: m.c}, nil
}

func (m *quicMux) accept(ctx context.Context) (net.Conn, error) {
	s, err := m.c.AcceptStream(ctx)
	if err != nil {
		return nil, err
	}
	return &quicStream{Stream: s, c: m.c}, nil
}

func (m *quicMux) closeWith(reason string) error {
	err := m.c.CloseWithError(0, reason)
	if m.tr != nil {
		_ = m.tr.Close()
		_ = m.tr.Conn.Close()
	}
	return err
}

func (m *quicMux) done() <-chan struct{}         { return m.c.Context().Done() }
func (m *quicMux) tlsState() tls.ConnectionState { return m.c.ConnectionState().TLS }
func (m *quicMux) transport() Transport          { return TransportQUIC }
func (m *quicMux) localAddr() net.Addr           { return m.c.LocalAddr() }
func (m *quicMux) remoteAddr() net.Addr          { return m.c.RemoteAddr() }

// quicStream makes a QUIC stream a net.Conn.
type quicStream struct {
	*quic.Stream
	c *quic.Conn
}

func (s *quicStream) LocalAddr() net.Addr  { return s.c.LocalAddr() }
func (s *quicStream) RemoteAddr() net.Addr { return s.c.RemoteAddr() }

// Close closes both directions: gRPC and callers expect net.Conn semantics,
// where Close also stops reads (QUIC's Close only ends the send side).
func (s *quicStream) Close() error {
	s.CancelRead(0)
	return s.Stream.Close()
}

var _ net.Conn = (*quicStream)(nil)

// --- TCP + TLS + yamux ---

type yamuxMux struct {
	s    *yamux.Session
	conn *tls.Conn
}

func yamuxConfig(l Liveness, lim Limits, log *slog.Logger) *yamux.Config {
	c := yamux.DefaultConfig()
	// Streams opened and not yet accepted (the opener's own backlog blocks
	// it there, so with ours on both ends nothing is reset). The accept
	// loop takes them at once; each slot costs 8 bytes in every session,
	// held for its life, so MaxStreams+1 of them would be waste.
	c.AcceptBacklog = min(lim.MaxStreams+1, 64)
	// The heartbeat keeps the TCP NAT binding (350 s) warm and decides
	// liveness; yamux's own keepalive would cost a goroutine per session.
	c.EnableKeepAlive = false
	// A write that cannot make progress for a heartbeat timeout means the
	// peer is gone: close the session instead of hanging the writer.
	c.ConnectionWriteTimeout = l.HeartbeatTimeout
	c.StreamOpenTimeout = l.HeartbeatTimeout
	c.StreamCloseTimeout = l.HeartbeatTimeout
	c.LogOutput = nil
	c.Logger = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	return c
}

func newYamux(conn *tls.Conn, server bool, l Liveness, lim Limits, log *slog.Logger) (*yamuxMux, error) {
	var (
		s   *yamux.Session
		err error
	)
	if server {
		s, err = yamux.Server(conn, yamuxConfig(l, lim, log))
	} else {
		s, err = yamux.Client(conn, yamuxConfig(l, lim, log))
	}
	if err != nil {
		return nil, fmt.Errorf("starting yamux over %s: %w", conn.RemoteAddr(), err)
	}
	return &yamuxMux{s: s, conn: conn}, nil
}

func (m *yamuxMux) open(ctx context.Context) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return m.s.OpenStream()
}

func (m *yamuxMux) accept(ctx context.Context) (net.Conn, error) {
	return m.s.AcceptStreamWithContext(ctx)
}

func (m *yamuxMux) closeWith(string) error        { return m.s.Close() }
func (m *yamuxMux) done() <-chan struct{}         { return m.s.CloseChan() }
func (m *yamuxMux) tlsState() tls.ConnectionState { return m.conn.ConnectionState() }
func (m *yamuxMux) transport() Transport          { return TransportTCP }
func (m *yamuxMux) localAddr() net.Addr           { return m.conn.LocalAddr() }
func (m *yamuxMux) remoteAddr() net.Addr          { return m.conn.RemoteAddr() }
