// Package clock owns levers9's one time source: an interface every part
// that reads the time or waits on it takes (Now, timers, tickers), the wall
// clock behind it in production, and a fake that tests advance by hand so
// they never sleep to see a timeout. It holds no state of its own beyond a
// Fake's; it never starts a goroutine. API: internal, stable.
package clock

import "time"

// Clock is a time source. Implementations are safe for concurrent use.
// Timers and tickers made from a Clock fire on that Clock's time: the wall
// clock's in production, a Fake's when a test advances it.
type Clock interface {
	Now() time.Time
	// Since is Now().Sub(t).
	Since(t time.Time) time.Duration
	// After fires once, d from now. Prefer NewTimer in loops: an After
	// that never fires holds its timer until it would have.
	After(d time.Duration) <-chan time.Time
	NewTimer(d time.Duration) Timer
	NewTicker(d time.Duration) Ticker
	// AfterFunc calls f in its own goroutine once d has passed, as
	// time.AfterFunc. The Timer's C is nil; Stop and Reset work.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a time.Timer of some Clock.
type Timer interface {
	C() <-chan time.Time
	// Stop and Reset behave as time.Timer's (Go 1.23 semantics: no stale
	// value is left in C after either).
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is a time.Ticker of some Clock.
type Ticker interface {
	C() <-chan time.Time
	Stop()
	Reset(d time.Duration)
}

// Real returns the wall clock.
func Real() Clock { return real{} }

// OrReal returns c, or the wall clock when c is nil: the one place a
// config's zero Clock becomes the real one.
func OrReal(c Clock) Clock {
	if c == nil {
		return real{}
	}
	return c
}

type real struct{}

func (real) Now() time.Time                         { return time.Now() }
func (real) Since(t time.Time) time.Duration        { return time.Since(t) }
func (real) After(d time.Duration) <-chan time.Time { return time.After(d) }
func (real) NewTimer(d time.Duration) Timer         { return realTimer{time.NewTimer(d)} }
func (real) NewTicker(d time.Duration) Ticker       { return realTicker{time.NewTicker(d)} }
func (real) AfterFunc(d time.Duration, f func()) Timer {
	return realTimer{time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time   { return r.t.C }
func (r realTicker) Stop()                 { r.t.Stop() }
func (r realTicker) Reset(d time.Duration) { r.t.Reset(d) }
