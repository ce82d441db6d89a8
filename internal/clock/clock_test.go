package clock

import (
	"testing"
	"time"
)

func recv(c <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-c:
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestFakeTimersFireInOrderOnAdvance(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		advance time.Duration
		fired   []bool // timers of 1s, 2s, 3s
	}{
		{"nothing due", 999 * time.Millisecond, []bool{false, false, false}},
		{"first due", time.Second, []bool{true, false, false}},
		{"two due", 2500 * time.Millisecond, []bool{true, true, false}},
		{"all due", time.Hour, []bool{true, true, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFake(start)
			ts := []Timer{f.NewTimer(time.Second), f.NewTimer(2 * time.Second), f.NewTimer(3 * time.Second)}
			f.Advance(tt.advance)
			for i, tm := range ts {
				v, ok := recv(tm.C())
				if ok != tt.fired[i] {
					t.Fatalf("timer %d fired=%v, want %v", i, ok, tt.fired[i])
				}
				if ok && !v.Equal(start.Add(time.Duration(i+1)*time.Second)) {
					t.Fatalf("timer %d fired with %v", i, v)
				}
			}
			if got := f.Now(); !got.Equal(start.Add(tt.advance)) {
				t.Fatalf("Now = %v", got)
			}
		})
	}
}

func TestFakeStopResetAndTicker(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of an armed timer reported false")
	}
	f.Advance(2 * time.Second)
	if _, ok := recv(tm.C()); ok {
		t.Fatal("a stopped timer fired")
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer reported it armed")
	}
	f.Advance(time.Second)
	if _, ok := recv(tm.C()); !ok {
		t.Fatal("a reset timer did not fire")
	}

	tk := f.NewTicker(time.Second)
	f.Advance(time.Second)
	if _, ok := recv(tk.C()); !ok {
		t.Fatal("ticker did not tick")
	}
	f.Advance(3 * time.Second) // one slot: missed ticks are dropped
	if _, ok := recv(tk.C()); !ok {
		t.Fatal("ticker did not tick again")
	}
	if _, ok := recv(tk.C()); ok {
		t.Fatal("ticker buffered more than one tick")
	}
	tk.Stop()
	if n := f.Waiters(); n != 0 {
		t.Fatalf("%d waiters after everything stopped", n)
	}
}

func TestFakeBlockUntil(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	got := make(chan time.Time)
	go func() { got <- <-f.After(time.Minute) }()
	if !f.BlockUntil(nil, 1) {
		t.Fatal("BlockUntil gave up")
	}
	f.Advance(time.Minute)
	if v := <-got; !v.Equal(time.Unix(60, 0)) {
		t.Fatalf("After fired with %v", v)
	}
	done := make(chan struct{})
	close(done)
	if f.BlockUntil(done, 5) {
		t.Fatal("BlockUntil reported 5 waiters")
	}
}

func TestFakeAfterFunc(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	called := make(chan struct{}, 2)
	tm := f.AfterFunc(time.Second, func() { called <- struct{}{} })
	if tm.C() != nil {
		t.Fatal("AfterFunc's timer has a channel")
	}
	f.Advance(999 * time.Millisecond)
	select {
	case <-called:
		t.Fatal("called early")
	default:
	}
	f.Advance(time.Millisecond)
	<-called
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a fired AfterFunc reported it armed")
	}
	if !tm.Stop() {
		t.Fatal("Stop of a reset AfterFunc reported it not armed")
	}
	f.Advance(time.Hour)
	select {
	case <-called:
		t.Fatal("a stopped AfterFunc was called")
	default:
	}
	if n := f.Waiters(); n != 0 {
		t.Fatalf("%d waiters after the AfterFunc stopped", n)
	}
}

func TestReal(t *testing.T) {
	c := OrReal(nil)
	if d := c.Since(c.Now()); d < 0 || d > time.Minute {
		t.Fatalf("Since(Now) = %v", d)
	}
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	called := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(called) })
	<-called
}
