package clock

import (
	"sort"
	"sync"
	"time"
)

// Fake is a Clock whose time moves only when a test calls Advance or Set.
// Timers and tickers fire, in time order, as Advance passes their deadline;
// each fired value is sent without blocking (a channel with one slot, as
// the runtime's timers), so a test never deadlocks on a reader that is not
// there yet. Safe for concurrent use.
type Fake struct {
	// mu guards the fields below.
	mu      sync.Mutex
	now     time.Time
	waiters []*fakeTimer
	// changed is closed and replaced whenever waiters changes, so
	// BlockUntil can wait without polling.
	changed chan struct{}
}

// NewFake returns a Fake reading start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, changed: make(chan struct{})}
}

var _ Clock = (*Fake)(nil)

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Since is Now().Sub(t).
func (f *Fake) Since(t time.Time) time.Duration { return f.Now().Sub(t) }

// After fires once Advance has moved d past now.
func (f *Fake) After(d time.Duration) <-chan time.Time { return f.NewTimer(d).C() }

// NewTimer makes a timer that fires once Advance has moved d past now.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addLocked(t, d)
	return t
}

// AfterFunc makes a timer that calls f in its own goroutine once Advance
// has moved d past now.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	t := &fakeTimer{f: f, fn: fn}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addLocked(t, d)
	return t
}

// NewTicker makes a ticker that fires every d of fake time.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	t := &fakeTimer{f: f, c: make(chan time.Time, 1), period: d}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addLocked(t, d)
	return fakeTicker{t}
}

// Advance moves the time forward by d, firing every timer and tick due on
// the way in order.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.setLocked(f.now.Add(d))
}

// Set moves the time to t (never backwards), firing what is due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.After(f.now) {
		f.setLocked(t)
	}
}

// Waiters is how many timers and tickers are armed.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// BlockUntil waits until at least n timers or tickers are armed, so a test
// advances only once the code under test is waiting. It returns false if
// done closes first.
func (f *Fake) BlockUntil(done <-chan struct{}, n int) bool {
	for {
		f.mu.Lock()
		if len(f.waiters) >= n {
			f.mu.Unlock()
			return true
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}

func (f *Fake) setLocked(end time.Time) {
	for {
		sort.SliceStable(f.waiters, func(i, j int) bool { return f.waiters[i].at.Before(f.waiters[j].at) })
		if len(f.waiters) == 0 || f.waiters[0].at.After(end) {
			break
		}
		t := f.waiters[0]
		f.now = t.at
		if t.fn != nil {
			go t.fn()
		} else {
			select {
			case t.c <- t.at:
			default: // a reader that missed a tick loses it, as with time.Ticker
			}
		}
		if t.period > 0 {
			t.at = t.at.Add(t.period)
		} else {
			f.removeLocked(t)
		}
	}
	f.now = end
}

func (f *Fake) addLocked(t *fakeTimer, d time.Duration) {
	t.at = f.now.Add(d)
	f.waiters = append(f.waiters, t)
	f.notifyLocked()
	if d <= 0 {
		f.setLocked(f.now)
	}
}

func (f *Fake) removeLocked(t *fakeTimer) bool {
	for i, w := range f.waiters {
		if w == t {
			f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
			f.notifyLocked()
			return true
		}
	}
	return false
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

type fakeTimer struct {
	f      *Fake
	c      chan time.Time // nil for AfterFunc
	fn     func()         // AfterFunc's, called instead of sending on c
	period time.Duration  // >0 for a ticker
	at     time.Time      // guarded by f.mu
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	armed := t.f.removeLocked(t)
	t.drain()
	return armed
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	armed := t.f.removeLocked(t)
	t.drain()
	t.f.addLocked(t, d)
	return armed
}

func (t *fakeTimer) drain() {
	select {
	case <-t.c:
	default:
	}
}

type fakeTicker struct{ t *fakeTimer }

func (k fakeTicker) C() <-chan time.Time { return k.t.C() }
func (k fakeTicker) Stop()               { k.t.Stop() }
func (k fakeTicker) Reset(d time.Duration) {
	k.t.f.mu.Lock()
	defer k.t.f.mu.Unlock()
	k.t.period = d
	k.t.f.removeLocked(k.t)
	k.t.drain()
	k.t.f.addLocked(k.t, d)
}
