package tunnel

import (
	"math"
	"sync"
	"time"
)

// admission is a token bucket over handshakes. A refused agent gets a
// retry-after hint that places it in a virtual queue, so a thousand agents
// refused at once are told to come back spread over time at the admission
// rate instead of all at the same instant.
type admission struct {
	rate  float64 // tokens per second
	burst float64

	// mu guards tokens, backlog and last.
	mu      sync.Mutex
	tokens  float64
	backlog float64 // agents told to come back and not yet expected
	last    time.Time
}

func newAdmission(rate float64, burst int, now time.Time) *admission {
	return &admission{rate: rate, burst: float64(burst), tokens: float64(burst), last: now}
}

// maxRetryAfter caps the hint so a huge backlog does not park agents for long.
const maxRetryAfter = 60 * time.Second

func (a *admission) admit(now time.Time) (bool, time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refillLocked(now)
	if a.tokens >= 1 {
		a.tokens--
		return true, 0
	}
	return false, a.queueLocked()
}

// minBusyWait is the least a busy refusal asks an agent to wait: the
// handshakes in flight need some time to finish even when tokens are left.
const minBusyWait = 250 * time.Millisecond

// busy places an agent refused before any crypto (too many handshakes in
// flight) in the same virtual queue and returns its hint.
func (a *admission) busy(now time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refillLocked(now)
	return max(a.queueLocked(), minBusyWait)
}

func (a *admission) refillLocked(now time.Time) {
	el := now.Sub(a.last).Seconds()
	if el > 0 {
		a.tokens = math.Min(a.burst, a.tokens+el*a.rate)
		a.backlog = math.Max(0, a.backlog-el*a.rate)
		a.last = now
	}
}

func (a *admission) queueLocked() time.Duration {
	a.backlog++
	wait := time.Duration((a.backlog + 1 - a.tokens) / a.rate * float64(time.Second))
	return min(max(wait, 0), maxRetryAfter)
}
