package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// Auto keeps one session to the controlplane up for as long as it runs.
//
//	         Start
//	           |
//	     +-> dialling --fail/refused--> backing off --+
//	     |     | ok                                   |
//	     |   up (OnSession runs) --probe QUIC ok--> up on QUIC (old TCP session closed)
//	     |     | session ended                        |
//	     +-----+-------------- backing off <----------+
//	Stop ends every state, closes the session and waits for OnSession.
type Auto struct {
	d         *Direct
	cfg       ClientConfig
	log       *slog.Logger
	onSession func(ctx context.Context, s Session)
	wg        sync.WaitGroup

	// mu guards everything below.
	mu      sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelFunc
	cur     Session
	// curReady is closed when cur is set; replaced when cur goes away.
	curReady chan struct{}
}

// NewAuto checks cfg. onSession (may be nil) runs in its own goroutine for
// each session with a context that ends when the session does; Auto closes
// the session after it returns or when the session is replaced.
func NewAuto(cfg ClientConfig, onSession func(ctx context.Context, s Session)) (*Auto, error) {
	d, err := NewDirect(cfg)
	if err != nil {
		return nil, err
	}
	return &Auto{d: d, cfg: d.cfg, log: d.log, onSession: onSession, curReady: make(chan struct{})}, nil
}

// Start launches the reconnect loop and returns at once.
func (a *Auto) Start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.started || a.stopped {
		return fmt.Errorf("tunnel auto client: already started or stopped: %w", errdefs.ErrFailedPrecondition)
	}
	a.started = true
	ctx, a.cancel = context.WithCancel(context.WithoutCancel(ctx))
	a.wg.Add(1)
	go a.run(ctx)
	return nil
}

// Stop ends the loop, closes the session and waits for every goroutine.
// Safe twice and before Start.
func (a *Auto) Stop() {
	a.mu.Lock()
	a.stopped = true
	cancel := a.cancel
	a.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	a.wg.Wait()
}

// Session waits for the current session (or ctx).
func (a *Auto) Session(ctx context.Context) (Session, error) {
	for {
		a.mu.Lock()
		cur, ready := a.cur, a.curReady
		a.mu.Unlock()
		if cur != nil {
			select {
			case <-cur.Done():
				// Ended but not yet cleared: wait for the next one.
			default:
				return cur, nil
			}
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for a tunnel session: %w", ctx.Err())
		}
		if cur != nil {
			// The ended session may still be installed; poll briefly.
			t := a.cfg.Clock.NewTimer(10 * time.Millisecond)
			select {
			case <-t.C():
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("waiting for a tunnel session: %w", ctx.Err())
			}
		}
	}
}

// OpenStream opens a stream on the current session, waiting for one.
func (a *Auto) OpenStream(ctx context.Context) (net.Conn, error) {
	s, err := a.Session(ctx)
	if err != nil {
		return nil, err
	}
	return s.OpenStream(ctx)
}

func (a *Auto) setCur(s Session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cur = s
	if s != nil {
		close(a.curReady)
	} else {
		a.curReady = make(chan struct{})
	}
}

// run is the reconnect loop.
func (a *Auto) run(ctx context.Context) {
	defer a.wg.Done()
	backoff := a.cfg.BackoffBase
	first := true
	for ctx.Err() == nil {
		s, err := a.d.Dial(ctx, DialRace)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			wait := fullJitter(backoff)
			if ra, ok := RetryAfterOf(err); ok {
				// Spread refused agents a little around the hint.
				wait = max(wait, ra+time.Duration(rand.Int64N(int64(ra/4)+1)))
			}
			var r *RefusedError
			if errors.As(err, &r) && r.Permanent {
				wait = a.cfg.BackoffMax
				a.log.Error("tunnel refused permanently, retrying at the slowest rate", "err", err, "wait", wait)
			} else {
				a.log.Warn("tunnel dial failed", "err", err, "wait", wait)
			}
			backoff = min(2*backoff, a.cfg.BackoffMax)
			if !a.sleep(ctx, wait) {
				return
			}
			continue
		}
		if !first {
			a.cfg.Metrics.reconnects.Inc()
		}
		first = false
		upSince := a.cfg.Clock.Now()
		a.hold(ctx, s)
		if a.cfg.Clock.Since(upSince) >= a.cfg.StableAfter {
			backoff = a.cfg.BackoffBase
		}
		if !a.sleep(ctx, fullJitter(backoff)) {
			return
		}
		backoff = min(2*backoff, a.cfg.BackoffMax)
	}
}

// hold serves s until it ends, moving to QUIC when a probe succeeds.
func (a *Auto) hold(ctx context.Context, s Session) {
	for {
		stopHandler := a.serve(ctx, s)
		moved := a.waitOrProbe(ctx, s)
		a.setCur(nil)
		stopHandler()
		_ = s.Close()
		if moved == nil {
			return
		}
		s = moved
	}
}

// serve installs s as current and runs onSession for it; the returned func
// cancels onSession and waits for it.
func (a *Auto) serve(ctx context.Context, s Session) func() {
	a.setCur(s)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if a.onSession != nil {
			a.onSession(sctx, s)
		}
	}()
	return func() { cancel(); <-done }
}

// waitOrProbe blocks until s ends or ctx does (nil), or returns a new
// session: a QUIC probe made while s is on TCP succeeded, or s went quiet
// (no heartbeat for two and a half intervals, as when the controlplane
// restarted and its reset was lost) and a fresh dial succeeded.
func (a *Auto) waitOrProbe(ctx context.Context, s Session) Session {
	var quiet <-chan struct{}
	if q, ok := s.(interface{ Quiet() <-chan struct{} }); ok {
		quiet = q.Quiet()
	}
	for {
		var probe <-chan time.Time
		stop := func() bool { return false }
		if s.Transport() == TransportTCP && !a.cfg.DisableQUIC {
			t := a.cfg.Clock.NewTimer(a.cfg.ReprobeInterval)
			probe, stop = t.C(), t.Stop
		}
		select {
		case <-s.Done():
			stop()
			return nil
		case <-ctx.Done():
			stop()
			return nil
		case <-quiet:
			stop()
			quiet = nil
			if n := a.redialQuiet(ctx, s); n != nil {
				return n
			}
			continue
		case <-probe:
		}
		q, err := a.d.Dial(ctx, DialQUICOnly)
		if err != nil {
			a.log.Debug("QUIC probe failed, staying on TCP", "err", err)
			continue
		}
		a.log.Info("QUIC works again, moving the tunnel off TCP")
		return q
	}
}

// redialQuiet dials until a new session is up or the quiet one ends; the
// first try waits up to half a heartbeat interval so a fleet that lost
// its controlplane at one instant does not come back at one instant.
func (a *Auto) redialQuiet(ctx context.Context, s Session) Session {
	wait := fullJitter(a.cfg.Liveness.HeartbeatInterval / 2)
	for {
		t := a.cfg.Clock.NewTimer(wait)
		select {
		case <-t.C():
		case <-s.Done():
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return nil
		}
		n, err := a.d.Dial(ctx, DialRace)
		if err == nil {
			a.cfg.Metrics.reconnects.Inc()
			a.log.Info("the controlplane went quiet; moved the tunnel to a new session")
			return n
		}
		if ctx.Err() != nil {
			return nil
		}
		a.log.Warn("the controlplane went quiet and a new session failed; keeping the old one until its heartbeat timeout", "err", err)
		wait = fullJitter(a.cfg.Liveness.HeartbeatInterval)
		if ra, ok := RetryAfterOf(err); ok {
			wait = max(wait, ra)
		}
	}
}

func (a *Auto) sleep(ctx context.Context, d time.Duration) bool {
	t := a.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

func fullJitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}
