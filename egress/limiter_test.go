package egress

import (
	"testing"
	"time"

	"github.com/levers9/levers9/internal/clock"
)

func TestLogLimiter(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	l := newLogLimiter(6, 2, clk) // one token every 10s, burst 2
	k := counterKey{key: "00c0ffee", class: ClassMetadata}
	other := counterKey{key: "00c0ffee", class: ClassPrivate}
	for i, want := range []bool{true, true, false, false} {
		if got, _ := l.allow(k); got != want {
			t.Fatalf("call %d: allow = %v, want %v", i, got, want)
		}
	}
	if ok, _ := l.allow(other); !ok {
		t.Error("another class shares the bucket")
	}
	clk.Advance(10 * time.Second)
	ok, suppressed := l.allow(k)
	if !ok || suppressed != 2 {
		t.Errorf("after refill: allow = %v suppressed = %d, want true 2", ok, suppressed)
	}
	if ok, _ := l.allow(k); ok {
		t.Error("bucket not emptied")
	}
	clk.Advance(time.Hour) // refill caps at the burst
	n := 0
	for i := 0; i < 10; i++ {
		if ok, _ := l.allow(k); ok {
			n++
		}
	}
	if n != 2 {
		t.Errorf("after an hour %d lines allowed, want the burst of 2", n)
	}
}
