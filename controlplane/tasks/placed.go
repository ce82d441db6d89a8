package tasks

import (
	"sync"
	"time"
)

// placedFresh is how long a replica trusts what it last learnt of an
// attempt (placed on a machine, still wanted there) before it asks
// Postgres again. A cancel or a loss on another replica reaches a report's
// Stop answer at most this late; the cancel push and the heartbeat's
// reconciliation do not wait for it.
const placedFresh = time.Second

// placedAttempts remembers, per task, the attempt this replica last placed
// or saw reported and whether it was wanted then, so the reports of a
// running task (its RUNNING update, then its output) do not each begin
// with a Postgres query: on a busy node that query took 1-4 ms on the
// path of every task's first line. Only facts that hold until a change
// this replica sees or placedFresh passes are kept: the machine an
// attempt was placed on never changes, and a cancel, loss or end seen here
// forgets the task at once.
type placedAttempts struct {
	// mu guards m.
	mu sync.Mutex
	m  map[string]placedAttempt
}

type placedAttempt struct {
	machine string
	n       int
	at      time.Time
}

// maxPlaced bounds the map between sweeps of stale entries.
const maxPlaced = 4096

func newPlacedAttempts() *placedAttempts {
	return &placedAttempts{m: map[string]placedAttempt{}}
}

// wanted reports whether attempt n of taskID is known, as of less than
// placedFresh before now, to be machine's and wanted.
func (p *placedAttempts) wanted(machine, taskID string, n int, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.m[taskID]
	return ok && e.machine == machine && e.n == n && e.fresh(now)
}

// fresh says whether what e records still holds at now (a clock that went
// back makes it stale).
func (e placedAttempt) fresh(now time.Time) bool {
	return now.Sub(e.at) < placedFresh && !now.Before(e.at)
}

// remember records that attempt n of taskID is machine's and wanted as of
// now.
func (p *placedAttempts) remember(machine, taskID string, n int, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) >= maxPlaced {
		for id, e := range p.m {
			if !e.fresh(now) {
				delete(p.m, id)
			}
		}
	}
	p.m[taskID] = placedAttempt{machine: machine, n: n, at: now}
}

// forget drops what is known of taskID's attempts.
func (p *placedAttempts) forget(taskID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, taskID)
}
