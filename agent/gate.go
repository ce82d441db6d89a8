package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// gateWait bounds how long a RunTask waits for the session's gate before
// it is refused (Unavailable, errdefs.ReasonAgentNotReady): the
// controlplane sends it again.
const gateWait = 3 * time.Second

// stopWait bounds how long the gate stays closed while the attempts the
// first heartbeat answer stopped are being killed (their kill grace).
const stopWait = 30 * time.Second

// sessionGate holds RunTask back on a new session until the session's
// first heartbeat is answered and the attempts the controlplane no longer
// counts as this agent's (its stop list) are killed: a container the
// controlplane gave up must be gone before this agent starts anything new.
//
//	closed (start, each new session) ──first answer, stops applied──> open
//	open ──new session──> closed
type sessionGate struct {
	clock clock.Clock
	// mu guards open and ch; ch is closed when the gate opens.
	mu   sync.Mutex
	open bool
	ch   chan struct{}
}

func newSessionGate(clk clock.Clock) *sessionGate {
	return &sessionGate{clock: clk, ch: make(chan struct{})}
}

// close shuts the gate (a new session began).
func (g *sessionGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open {
		g.open, g.ch = false, make(chan struct{})
	}
}

// openUp opens the gate; safe when open.
func (g *sessionGate) openUp() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open {
		g.open = true
		close(g.ch)
	}
}

// wait returns nil once the gate is open, or an Unavailable error naming
// what is awaited after gateWait or the end of ctx.
func (g *sessionGate) wait(ctx context.Context, what string) error {
	g.mu.Lock()
	ch := g.ch
	open := g.open
	g.mu.Unlock()
	if open {
		return nil
	}
	t := g.clock.NewTimer(gateWait)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	case <-t.C():
	}
	return errdefs.UnavailableWithReason(fmt.Errorf("%s: this agent's session is not ready: its first heartbeat is not answered yet or the attempts it stopped are still being killed; send again: %w",
		what, errdefs.ErrUnavailable), errdefs.ReasonAgentNotReady)
}
