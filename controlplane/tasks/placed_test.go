package tasks

import (
	"testing"
	"time"
)

func TestPlacedAttempts(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		prepare func(p *placedAttempts)
		machine string
		n       int
		at      time.Time
		want    bool
	}{
		{"unknown", func(*placedAttempts) {}, "m1", 1, t0, false},
		{"fresh", func(p *placedAttempts) { p.remember("m1", "t", 1, t0) }, "m1", 1, t0.Add(placedFresh / 2), true},
		{"stale", func(p *placedAttempts) { p.remember("m1", "t", 1, t0) }, "m1", 1, t0.Add(placedFresh), false},
		{"clock went back", func(p *placedAttempts) { p.remember("m1", "t", 1, t0) }, "m1", 1, t0.Add(-time.Millisecond), false},
		{"another machine", func(p *placedAttempts) { p.remember("m1", "t", 1, t0) }, "m2", 1, t0, false},
		{"an earlier attempt", func(p *placedAttempts) { p.remember("m1", "t", 2, t0) }, "m1", 1, t0, false},
		{"forgotten", func(p *placedAttempts) { p.remember("m1", "t", 1, t0); p.forget("t") }, "m1", 1, t0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlacedAttempts()
			tc.prepare(p)
			if got := p.wanted(tc.machine, "t", tc.n, tc.at); got != tc.want {
				t.Errorf("wanted(%s, t, %d) = %v, want %v", tc.machine, tc.n, got, tc.want)
			}
		})
	}
}

// TestPlacedAttemptsStayBounded: stale entries go once the map is full, so
// a replica that placed many tasks does not keep them all.
func TestPlacedAttemptsStayBounded(t *testing.T) {
	p := newPlacedAttempts()
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	for i := range maxPlaced {
		p.remember("m", string(rune('a'+i%26))+time.Duration(i).String(), 1, t0)
	}
	later := t0.Add(placedFresh)
	p.remember("m", "new", 1, later)
	if len(p.m) != 1 || !p.wanted("m", "new", 1, later) {
		t.Errorf("after a sweep: %d entries (want 1), new one wanted %v", len(p.m), p.wanted("m", "new", 1, later))
	}
}
