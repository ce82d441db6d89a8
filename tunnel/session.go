package tunnel

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// Transport names the carrier of a session.
type Transport string

// The two transports.
const (
	TransportQUIC Transport = "quic"
	TransportTCP  Transport = "tcp"
)

// ALPN is the protocol both transports negotiate; it versions the wire format.
const ALPN = "levers9-tunnel/1"

// Session is one authenticated, multiplexed connection between an agent and
// the controlplane.
//
// Contract:
//   - OpenStream blocks until the stream is open, ctx ends or the session
//     closes; AcceptStream blocks until the peer opens one, ctx ends or the
//     session closes. Both are safe for concurrent use.
//   - Streams are net.Conns with working deadlines. Closing a stream is
//     idempotent. When the session ends every stream fails.
//   - Close is idempotent and safe concurrently with everything else; Done is
//     closed once the session has ended for any reason, and Err then says why.
//   - Identity, PeerCertificate and Transport never change.
type Session interface {
	OpenStream(ctx context.Context) (net.Conn, error)
	AcceptStream(ctx context.Context) (net.Conn, error)
	Close() error
	Done() <-chan struct{}
	Err() error
	// Identity is what the server's Authorizer returned for the agent's
	// certificate (on the server), or the server certificate's common name
	// (on the agent).
	Identity() string
	PeerCertificate() *x509.Certificate
	Transport() Transport
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
}

// Addr is the address reported by streams of a session. gRPC handlers find it
// in peer.FromContext(ctx).Addr and so learn which agent is calling.
type Addr struct {
	Identity  string
	Transport Transport
	Remote    net.Addr
}

func (a *Addr) Network() string { return "levers9-tunnel+" + string(a.Transport) }
func (a *Addr) String() string {
	if a.Remote == nil {
		return a.Identity
	}
	return a.Identity + "@" + a.Remote.String()
}

// Errors the tunnel returns, all wrapping an errdefs kind.
var (
	// ErrClosed: the session or server was closed locally.
	ErrClosed = fmt.Errorf("tunnel closed: %w", errdefs.ErrUnavailable)
	// ErrPeerDead: no heartbeat arrived within Config.HeartbeatTimeout.
	ErrPeerDead = fmt.Errorf("tunnel peer missed its heartbeats: %w", errdefs.ErrUnavailable)
	// ErrTooManyStreams: the peer exceeded Config.MaxStreams.
	ErrTooManyStreams = fmt.Errorf("tunnel stream limit reached: %w", errdefs.ErrUnavailable)
)

// RefusedError is what a dial returns when the server completed TLS but
// refused the session. RetryAfter is a hint (0 means none); Permanent means
// the same certificate will never be admitted (unknown, revoked, expired).
type RefusedError struct {
	Reason     string
	RetryAfter time.Duration
	Permanent  bool
}

func (e *RefusedError) Error() string {
	if e.Permanent || e.RetryAfter <= 0 {
		return "tunnel refused by server: " + e.Reason
	}
	return fmt.Sprintf("tunnel refused by server: %s (retry after %s)", e.Reason, e.RetryAfter)
}

// Retryable reports whether dialling again can succeed.
func (e *RefusedError) Retryable() bool { return !e.Permanent }

// Unwrap maps a refusal to its errdefs kind.
func (e *RefusedError) Unwrap() error {
	if e.Permanent {
		return errdefs.ErrPermissionDenied
	}
	return errdefs.ErrUnavailable
}

// RetryAfterOf returns the retry-after hint carried by err, if any.
func RetryAfterOf(err error) (time.Duration, bool) {
	var r *RefusedError
	if errors.As(err, &r) && !r.Permanent && r.RetryAfter > 0 {
		return r.RetryAfter, true
	}
	return 0, false
}
