package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// Follow streams a task's events from fromCursor (empty: the start) to fn,
// in order, until the task's terminal state has been delivered; then it
// returns nil. When the stream breaks (the connection drops, the
// controlplane restarts or ends the stream early) it reconnects with
// backoff from the last cursor it delivered, so fn sees every event once,
// with no gaps, across reconnects and attempts. It gives up when the
// controlplane stays unreachable past the retry window (WithRetryWindow),
// when the task does not exist or the call is refused, or when ctx ends
// (returning ctx's error). An error from fn stops following and is returned
// as is.
func (c *Client) Follow(ctx context.Context, taskID, fromCursor string, fn func(*TaskEvent) error) error {
	if taskID == "" {
		return errors.New("follow task: no task ID")
	}
	cursor := fromCursor
	bo := c.newBackoff()
	op := "follow task " + taskID
	for {
		done, progressed, err := c.followOnce(ctx, taskID, &cursor, false, fn)
		if done {
			return nil
		}
		var fnErr *callbackError
		if errors.As(err, &fnErr) {
			return fnErr.err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if progressed {
			bo.reset()
		}
		if err == nil && !progressed {
			// A clean end with nothing after the cursor: either the task
			// ended before the cursor (resuming a finished task) or the
			// server cut the stream short. Only the task's state tells.
			t, terr := c.Task(ctx, taskID)
			if terr != nil {
				return terr
			}
			if IsTerminal(t.GetState()) {
				return nil
			}
		}
		if err != nil && !retryable(err) {
			return c.apiErr(op, err)
		}
		if !bo.wait(ctx) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("%w (gave up reconnecting after %s; resume with the last cursor)", c.apiErr(op, err), c.retryWindow)
		}
	}
}

// Logs calls fn for a task's events stored so far, from fromCursor, and
// returns: the task's output up to now, without waiting for more. A
// dropped stream is resumed from the last cursor within the retry window.
func (c *Client) Logs(ctx context.Context, taskID, fromCursor string, fn func(*TaskEvent) error) error {
	if taskID == "" {
		return errors.New("task logs: no task ID")
	}
	cursor := fromCursor
	bo := c.newBackoff()
	for {
		_, progressed, err := c.followOnce(ctx, taskID, &cursor, true, fn)
		var fnErr *callbackError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &fnErr):
			return fnErr.err
		case ctx.Err() != nil:
			return ctx.Err()
		case !retryable(err):
			return c.apiErr("task logs "+taskID, err)
		}
		if progressed {
			bo.reset()
		}
		if !bo.wait(ctx) {
			return c.apiErr("task logs "+taskID, err)
		}
	}
}

// callbackError marks an error returned by Follow's fn.
type callbackError struct{ err error }

func (e *callbackError) Error() string { return e.err.Error() }

// followOnce runs one FollowTask stream. done reports that the terminal
// state was delivered and the stream ended; progressed that at least one
// event arrived. A stream that ends without the terminal state returns
// done=false and err=nil: the server cut it short, so the caller resumes.
func (c *Client) followOnce(ctx context.Context, taskID string, cursor *string, noWait bool, fn func(*TaskEvent) error) (done, progressed bool, err error) {
	sctx, cancel := context.WithCancel(c.authed(ctx))
	defer cancel()
	stream, err := c.tasks.FollowTask(sctx, &v1.FollowTaskRequest{Id: taskID, Cursor: *cursor, NoWait: noWait})
	if err != nil {
		return false, false, err
	}
	terminal := false
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return terminal, progressed, nil
		}
		if err != nil {
			return false, progressed, err
		}
		progressed = true
		*cursor = ev.GetCursor()
		if s := ev.GetState(); s != nil && IsTerminal(s.GetTaskState()) {
			terminal = true
		}
		if err := fn(ev); err != nil {
			return false, progressed, &callbackError{err}
		}
	}
}

// IsTerminal reports whether a task in state s has finished.
func IsTerminal(s v1.TaskState) bool {
	switch s {
	case v1.TaskState_TASK_STATE_SUCCEEDED, v1.TaskState_TASK_STATE_FAILED,
		v1.TaskState_TASK_STATE_CANCELLED, v1.TaskState_TASK_STATE_TIMED_OUT:
		return true
	}
	return false
}

// backoff spaces out retries (exponential with jitter) and gives up once
// no progress was made for the retry window.
type backoff struct {
	min, max, cur time.Duration
	window        time.Duration
	deadline      time.Time
}

func (c *Client) newBackoff() *backoff {
	b := &backoff{min: c.backoffMin, max: c.backoffMax, window: c.retryWindow}
	b.reset()
	return b
}

// reset starts over after progress.
func (b *backoff) reset() {
	b.cur = b.min
	b.deadline = time.Now().Add(b.window)
}

// wait sleeps before the next try; false means give up (window passed or
// ctx done).
func (b *backoff) wait(ctx context.Context) bool {
	left := time.Until(b.deadline)
	if left <= 0 {
		return false
	}
	// Full jitter over [cur/2, cur): many clients reconnecting to a
	// restarted controlplane do not arrive together.
	d := b.cur/2 + rand.N(b.cur/2+1)
	d = min(d, left)
	b.cur = min(b.cur*2, b.max)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
