package egress

import (
	"sync"
	"time"

	"github.com/levers9/levers9/internal/clock"
)

// logLimiter bounds match log lines per (container, class) on top of the
// kernel's per-rule limit, which multiplies with the number of rules: a
// token bucket of burst lines refilled at perMinute. Suppressed lines are
// counted and reported with the next line let through.
type logLimiter struct {
	perMinute, burst int
	clock            clock.Clock

	// mu guards buckets.
	mu      sync.Mutex
	buckets map[counterKey]*logBucket
}

type logBucket struct {
	tokens     float64
	last       time.Time
	suppressed uint64
}

func newLogLimiter(perMinute, burst int, c clock.Clock) *logLimiter {
	return &logLimiter{perMinute: perMinute, burst: burst, clock: clock.OrReal(c), buckets: map[counterKey]*logBucket{}}
}

// allow reports whether a line for k may be logged, and how many were
// suppressed since the last one that was.
func (l *logLimiter) allow(k counterKey) (bool, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	b := l.buckets[k]
	if b == nil {
		b = &logBucket{tokens: float64(l.burst), last: now}
		l.buckets[k] = b
	}
	b.tokens += now.Sub(b.last).Minutes() * float64(l.perMinute)
	b.tokens = min(b.tokens, float64(l.burst))
	b.last = now
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	s := b.suppressed
	b.suppressed = 0
	return true, s
}
