package tunnel

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// DefaultPort is the controlplane's tunnel port (UDP for QUIC, TCP for
// TLS+yamux).
const DefaultPort = "1995"

// Liveness holds the heartbeat and keepalive settings both sides use. The
// defaults detect a dead peer within 15 s and keep NAT bindings that expire
// after 30 s (UDP) or 350 s (TCP) alive.
type Liveness struct {
	// HeartbeatInterval is how often each side writes a heartbeat (default 3 s).
	HeartbeatInterval time.Duration
	// HeartbeatTimeout closes the session when nothing arrived on the
	// control stream for this long (default 12 s).
	HeartbeatTimeout time.Duration
	// HandshakeTimeout bounds TLS plus the tunnel hello (default 10 s).
	HandshakeTimeout time.Duration
}

// quietAfter is how long a client waits for a heartbeat before it tries a
// new session beside the silent one: two intervals and a half, so one
// late heartbeat is not enough.
func (l Liveness) quietAfter() time.Duration {
	return 2*l.HeartbeatInterval + l.HeartbeatInterval/2
}

// WithDefaults fills zero fields.
func (l Liveness) WithDefaults() Liveness {
	orDefault(&l.HeartbeatInterval, 3*time.Second)
	orDefault(&l.HeartbeatTimeout, 12*time.Second)
	orDefault(&l.HandshakeTimeout, 10*time.Second)
	return l
}

// Validate reports every bad field at once, prefixed with prefix.
func (l Liveness) Validate(prefix string) error {
	var errs []error
	if l.HeartbeatInterval <= 0 {
		errs = append(errs, fmt.Errorf("%sheartbeatInterval: must be > 0, got %s: %w", prefix, l.HeartbeatInterval, errdefs.ErrInvalidArgument))
	}
	if l.HeartbeatTimeout < 2*l.HeartbeatInterval {
		errs = append(errs, fmt.Errorf("%sheartbeatTimeout: must be at least twice heartbeatInterval (%s), got %s: %w", prefix, l.HeartbeatInterval, l.HeartbeatTimeout, errdefs.ErrInvalidArgument))
	}
	if l.HandshakeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%shandshakeTimeout: must be > 0, got %s: %w", prefix, l.HandshakeTimeout, errdefs.ErrInvalidArgument))
	}
	return errors.Join(errs...)
}

// Limits bound what one peer may cost.
type Limits struct {
	// MaxStreams is the most concurrent streams the peer may open (default 256).
	MaxStreams int
	// MaxMessageSize is the largest gRPC message sent or received by the
	// helpers in this package (default 16 MiB).
	MaxMessageSize int
}

// WithDefaults fills zero fields.
func (l Limits) WithDefaults() Limits {
	orDefault(&l.MaxStreams, 256)
	orDefault(&l.MaxMessageSize, 16<<20)
	return l
}

// Validate reports every bad field at once, prefixed with prefix.
func (l Limits) Validate(prefix string) error {
	var errs []error
	if l.MaxStreams < 1 {
		errs = append(errs, fmt.Errorf("%smaxStreams: must be >= 1, got %d: %w", prefix, l.MaxStreams, errdefs.ErrInvalidArgument))
	}
	if l.MaxMessageSize < 1024 {
		errs = append(errs, fmt.Errorf("%smaxMessageSize: must be >= 1024, got %d: %w", prefix, l.MaxMessageSize, errdefs.ErrInvalidArgument))
	}
	return errors.Join(errs...)
}

// orDefault sets *p to v when *p is the zero value.
func orDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// sharedDefaults fills the zero fields ClientConfig and ServerConfig have
// in common, so both sides default them the same way.
func sharedDefaults(live *Liveness, lim *Limits, logger **slog.Logger, metrics **Metrics, clk *clock.Clock) {
	*live = live.WithDefaults()
	*lim = lim.WithDefaults()
	if *logger == nil {
		*logger = slog.New(slog.DiscardHandler)
	}
	*metrics = orNewMetrics(*metrics)
	*clk = clock.OrReal(*clk)
}
