package agent

import (
	"context"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/clock"
)

// TestWaitIdle: --exit-when-idle counts from the start and from the last
// attempt the agent let go, never while it holds one.
func TestWaitIdle(t *testing.T) {
	t.Parallel()
	tk := newTasks(nil, nil, ReportConfig{}, clock.Real(), nil, "default")
	tk.start(context.Background())
	a := &Agent{o: RunOptions{Clock: clock.Real()}, tasks: tk}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	key := attemptKey{taskID: "t_1", attempt: 1}
	tk.mu.Lock()
	h := &held{key: key, q: newReportQueue(ReportConfig{})}
	tk.held[key] = h
	tk.mu.Unlock()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if idle := a.WaitIdle(short, 50*time.Millisecond); idle != 0 {
		t.Fatalf("idle %s while holding an attempt", idle)
	}

	// Letting go of the attempt (forget) restarts the idle count.
	time.Sleep(250 * time.Millisecond)
	tk.forget(h)
	start := time.Now()
	idle := a.WaitIdle(ctx, 200*time.Millisecond)
	if idle < 200*time.Millisecond || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("WaitIdle returned %s after %s, want >= 200ms of idleness", idle, time.Since(start))
	}
}
