package taskrun

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/testenv"
)

func newTestLogsHook(sink LogSink, clk clock.Clock) *logsHook {
	return &logsHook{sink: sink, capacity: 4, maxBytes: 1 << 10, maxLine: 64, drainTimeout: time.Minute, clock: clk,
		logger: slog.New(slog.DiscardHandler)}
}

// TestLogsHookDrainTimeout: a sink stuck at exit holds the attempt only
// for the drain timeout, and what it never took counts as dropped.
func TestLogsHookDrainTimeout(t *testing.T) {
	clk := clock.NewFake(fixedNow())
	took := make(chan LogLine, 10)
	sink := LogSinkFunc(func(ctx context.Context, l LogLine) error {
		took <- l
		<-ctx.Done() // stuck until the hook gives up
		return ctx.Err()
	})
	h := newTestLogsHook(sink, clk)
	ctx := context.Background()
	var resp PrestartResponse
	if err := h.Prestart(ctx, &PrestartRequest{}, &resp); err != nil {
		t.Fatal(err)
	}
	var again PrestartResponse
	if err := h.Prestart(ctx, &PrestartRequest{}, &again); err != nil || again.Stdout != resp.Stdout {
		t.Fatalf("second Prestart gave other writers: %v", err)
	}
	for _, s := range []string{"a\n", "b\n", "c\n", "d\n", "e\n", "f\n", "g"} {
		_, _ = resp.Stdout.Write([]byte(s))
	}
	<-took // the pump holds "a" in the sink; b..g queue (4 fit)
	done := make(chan ExitedResponse)
	go func() {
		var er ExitedResponse
		_ = h.Exited(ctx, &ExitedRequest{}, &er)
		done <- er
	}()
	testenv.Eventually(t, 5*time.Second, "the drain timer", func() bool { return clk.Waiters() == 1 })
	clk.Advance(time.Minute)
	er := <-done
	// a (cancelled in the sink) + 2 pushed out of the queue + 4 queued
	// ones never delivered (d, e, f and the flushed g) = 7.
	if er.DroppedLines != 7 {
		t.Errorf("dropped %d, want 7", er.DroppedLines)
	}
	var again2 ExitedResponse
	if err := h.Exited(ctx, &ExitedRequest{}, &again2); err != nil || again2.DroppedLines != 7 {
		t.Errorf("second Exited = %d, %v", again2.DroppedLines, err)
	}
	for i := 0; i < 2; i++ {
		if err := h.Stop(ctx, &StopRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := resp.Stdout.Write([]byte("late\n")); n != 5 {
		t.Errorf("write after stop = %d, want accepted (and dropped)", n)
	}
}

// TestLogsHookStopWithoutStart: Stop before Prestart and twice is fine.
func TestLogsHookStopWithoutStart(t *testing.T) {
	h := newTestLogsHook(LogSinkFunc(func(context.Context, LogLine) error { return nil }), clock.NewFake(fixedNow()))
	for i := 0; i < 2; i++ {
		if err := h.Stop(context.Background(), &StopRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if h.dropped() != 0 {
		t.Errorf("dropped %d", h.dropped())
	}
}
