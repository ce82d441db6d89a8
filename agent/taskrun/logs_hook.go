package taskrun

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/levers9/levers9/internal/clock"
)

// LogSink receives a task's output lines in order (per stream; lines of
// the two streams interleave in the order the agent read them).
//
// Contract: Line is called from one goroutine per attempt and may block
// (a slow network), but must return once ctx ends. A slow sink never slows
// the container: lines queue up to the Runner's buffer and the oldest are
// dropped beyond it (counted, and marked on the next delivered line). An
// error drops that line and is logged once.
type LogSink interface {
	Line(ctx context.Context, l LogLine) error
}

// LogSinkFunc adapts a function to LogSink.
type LogSinkFunc func(ctx context.Context, l LogLine) error

// Line implements LogSink.
func (f LogSinkFunc) Line(ctx context.Context, l LogLine) error { return f(ctx, l) }

// logsHook gives the container non-blocking stdout and stderr writers
// feeding one bounded queue, and pumps the queue into the sink from its own
// goroutine. At exit it drains what is left, for at most drainTimeout.
type logsHook struct {
	sink         LogSink
	capacity     int
	maxBytes     int
	maxLine      int
	drainTimeout time.Duration
	clock        clock.Clock
	logger       *slog.Logger
	// from are the output file offsets a resumed attempt's streams start
	// at (Shipped), so each line's End is its offset in the file.
	from Shipped

	// mu guards the fields below.
	mu      sync.Mutex
	q       *lineQueue
	stdout  *lineWriter
	stderr  *lineWriter
	cancel  context.CancelFunc
	closing chan struct{}
	done    chan struct{}
	drained bool
}

var (
	_ Prestarter = (*logsHook)(nil)
	_ Exiter     = (*logsHook)(nil)
	_ Stopper    = (*logsHook)(nil)
)

func (h *logsHook) Name() string { return "logs" }

func (h *logsHook) Prestart(ctx context.Context, req *PrestartRequest, resp *PrestartResponse) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.q == nil {
		h.q = newLineQueue(h.capacity, h.maxBytes)
		h.stdout = &lineWriter{stream: Stdout, q: h.q, now: h.clock.Now, maxLine: h.maxLine, pos: h.from.Stdout}
		h.stderr = &lineWriter{stream: Stderr, q: h.q, now: h.clock.Now, maxLine: h.maxLine, pos: h.from.Stderr}
		// The pump outlives Prestart's ctx: it ends at exit or Stop.
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		h.cancel, h.closing, h.done = cancel, make(chan struct{}), make(chan struct{})
		go h.pump(pctx, h.q, h.closing, h.done)
	}
	resp.Stdout, resp.Stderr = h.stdout, h.stderr
	return nil
}

func (h *logsHook) pump(ctx context.Context, q *lineQueue, closing <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	var failed bool
	for {
		for {
			l, ok := q.pop()
			if !ok {
				break
			}
			if err := h.sink.Line(ctx, l); err != nil {
				q.countDropped(1)
				if ctx.Err() != nil {
					return
				}
				if !failed {
					h.logger.Warn("log sink refused a line; dropping", "err", err)
					failed = true
				}
			}
		}
		select {
		case <-q.notify:
		case <-closing:
			// Closed queues take no more lines: one last pass empties it.
			if q.empty() {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// Exited flushes unterminated lines and waits for the sink to take the
// rest, for at most drainTimeout (or until ctx ends); what it could not
// deliver counts as dropped.
func (h *logsHook) Exited(ctx context.Context, req *ExitedRequest, resp *ExitedResponse) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.q == nil {
		return nil
	}
	if !h.drained {
		h.drained = true
		h.stdout.flush()
		h.stderr.flush()
		h.q.close(false)
		close(h.closing)
		select {
		case <-h.done:
		case <-h.clock.After(h.drainTimeout):
		case <-ctx.Done():
		}
		h.cancel()
		<-h.done
		h.q.close(true)
	}
	resp.DroppedLines = h.q.droppedLines()
	return nil
}

// Stop ends the pump without draining (a task that never ran, or a
// detaching agent). Idempotent.
func (h *logsHook) Stop(ctx context.Context, req *StopRequest) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.q == nil {
		return nil
	}
	h.cancel()
	<-h.done
	h.q.close(true)
	return nil
}

// dropped returns the lines dropped so far.
func (h *logsHook) dropped() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.q == nil {
		return 0
	}
	return h.q.droppedLines()
}
