package sdk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sdk/sdktest"
)

const (
	stdout = v1.LogStream_LOG_STREAM_STDOUT
	stderr = v1.LogStream_LOG_STREAM_STDERR
)

// lines makes n numbered output lines.
func lines(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// TestFollowResumesWithoutGapsOrDuplicates: streams cut at every few
// events (with an error, or cleanly as a stopping server would) are
// resumed from the last cursor, across two attempts, and every event
// arrives once and in order.
func TestFollowResumesWithoutGapsOrDuplicates(t *testing.T) {
	t.Parallel()
	srv, c := scripted(t, nil)
	task, err := c.Function("f").Submit(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	id := task.Id
	srv.StartAttempt(id, "m_a")
	srv.Log(id, stdout, lines("a", 10)...)
	srv.LoseAttempt(id, "tunnel gone", false)
	srv.StartAttempt(id, "m_b")
	srv.Log(id, stdout, lines("b", 10)...)
	srv.Log(id, stderr, "warn")
	srv.Finish(id, v1.TaskState_TASK_STATE_SUCCEEDED, 0, "")

	srv.CutNext(4, 3)
	srv.EOFNext(2, 5)
	var got []string
	if err := c.Follow(context.Background(), id, "", func(ev *TaskEvent) error {
		got = append(got, ev.Cursor)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := 1 + 2 + 10 + 1 + 2 + 10 + 1 + 1 // pending, attempt 1, lines, lost, attempt 2, lines, stderr, end
	if len(got) != want {
		t.Fatalf("got %d events, want %d: %v", len(got), want, got)
	}
	for i, cur := range got {
		if cur != fmt.Sprint(i) {
			t.Fatalf("event %d has cursor %s: a gap or a duplicate in %v", i, cur, got)
		}
	}
	if f := srv.Follows(); len(f) != 7 || f[0] != "" || f[1] != "2" {
		t.Errorf("follow calls from cursors %v, want 7 resuming after each cut", f)
	}

	// Resuming from a cursor delivers only what came after it; resuming
	// after the last event of a finished task returns at once.
	var after []string
	if err := c.Follow(context.Background(), id, "20", func(ev *TaskEvent) error { after = append(after, ev.Cursor); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(after, ",") != "21,22,23,24,25,26,27" {
		t.Errorf("from cursor 20: %v", after)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Follow(ctx, id, got[len(got)-1], func(*TaskEvent) error { t.Error("event after the end"); return nil }); err != nil {
		t.Errorf("follow from the last cursor: %v", err)
	}
}

func TestFollowErrors(t *testing.T) {
	t.Parallel()
	srv, c := scripted(t, nil, WithRetryWindow(300*time.Millisecond))
	task, _ := c.Function("f").Submit(context.Background())
	// An unknown task is final, not retried.
	err := c.Follow(context.Background(), "t_nope", "", func(*TaskEvent) error { return nil })
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "follow task t_nope: task t_nope not found") {
		t.Errorf("unknown task: %v (%v)", err, status.Code(err))
	}
	// The callback's error stops following and comes back as is.
	stop := errors.New("enough")
	if err := c.Follow(context.Background(), task.Id, "", func(*TaskEvent) error { return stop }); err != stop {
		t.Errorf("callback error: %v", err)
	}
	// ctx ends following with its error.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Follow(ctx, task.Id, "", func(*TaskEvent) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ctx deadline: %v", err)
	}
	// A stream that keeps breaking without progress gives up after the
	// retry window, saying so.
	srv.CutNext(1000, 0)
	start := time.Now()
	err = c.Follow(context.Background(), task.Id, "", func(*TaskEvent) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "gave up") || status.Code(err) != codes.Unavailable || time.Since(start) > 5*time.Second {
		t.Errorf("endless cuts: %v after %s", err, time.Since(start))
	}
}

func TestRemote(t *testing.T) {
	t.Parallel()
	srv, c := scripted(t, nil)
	fn := c.Function("train", Command("python", "train.py"), Retries(1), MaxOutput(18))

	// The scripted "agent": run each submitted task as the test says.
	type outcome struct {
		id  string
		res *Result
		err error
	}
	run := func(script func(id string)) outcome {
		done := make(chan outcome, 1)
		before := len(srv.Tasks())
		go func() {
			res, err := fn.Remote(context.Background(), "--epochs", "1")
			id := ""
			if res != nil {
				id = res.TaskID
			}
			done <- outcome{id, res, err}
		}()
		sdktest.WaitFor(t, "a submit", func() bool { return len(srv.Tasks()) > before })
		script(srv.Tasks()[before])
		select {
		case o := <-done:
			return o
		case <-time.After(10 * time.Second):
			t.Fatal("Remote did not return")
			return outcome{}
		}
	}

	o := run(func(id string) {
		srv.StartAttempt(id, "m_a")
		srv.Log(id, stdout, "loss 0.9", "loss 0.5")
		srv.LoseAttempt(id, "spot reclaimed", false)
		srv.StartAttempt(id, "m_b")
		srv.Log(id, stdout, "loss 0.4", "loss 0.1")
		srv.Log(id, stderr, "done")
		srv.Finish(id, v1.TaskState_TASK_STATE_SUCCEEDED, 0, "")
	})
	if o.err != nil || o.res.State != v1.TaskState_TASK_STATE_SUCCEEDED || o.res.Attempts != 2 ||
		o.res.Stdout != "loss 0.4\nloss 0.1\n" || !o.res.StdoutTruncated || o.res.Stderr != "done\n" || o.res.StderrTruncated {
		t.Errorf("success across attempts: %+v, %v", o.res, o.err)
	}

	o = run(func(id string) {
		srv.StartAttempt(id, "m_a")
		srv.Log(id, stderr, "Traceback")
		srv.Finish(id, v1.TaskState_TASK_STATE_FAILED, 2, "")
	})
	var te *TaskError
	if !errors.As(o.err, &te) || te.ExitCode != 2 || o.res.ExitCode == nil || *o.res.ExitCode != 2 || o.err.Error() != "function train: task "+o.id+" exited with code 2" {
		t.Errorf("exit 2: %+v, %v", o.res, o.err)
	}

	o = run(func(id string) {
		srv.StartAttempt(id, "m_a")
		srv.LoseAttempt(id, "x", false)
		srv.StartAttempt(id, "m_b")
		srv.LoseAttempt(id, "machine deleted", true)
	})
	if !errors.As(o.err, &te) || !te.Lost || !strings.Contains(o.err.Error(), "lost its machine on attempt 2 with no retries left") {
		t.Errorf("lost: %v", o.err)
	}
	if o.res.ExitCode != nil {
		t.Errorf("a task lost without an exit code has exit code %d", *o.res.ExitCode)
	}

	// A submit whose replies are lost is retried with the same key: the
	// controlplane saw three submits and made one task.
	srv.LoseSubmitReplies(2)
	before := srv.Submits()
	o = run(func(id string) {
		srv.StartAttempt(id, "m_a")
		srv.Finish(id, v1.TaskState_TASK_STATE_SUCCEEDED, 0, "")
	})
	if o.err != nil || srv.Submits()-before != 3 || len(srv.Tasks()) != 4 {
		t.Errorf("lost submit replies: %v, %d submits, %d tasks", o.err, srv.Submits()-before, len(srv.Tasks()))
	}
}

func TestRemoteCancelledContextCancelsTask(t *testing.T) {
	t.Parallel()
	srv, c := scripted(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var res *Result
	go func() {
		var err error
		res, err = c.Function("f").Remote(ctx, "sleep", "100")
		done <- err
	}()
	sdktest.WaitFor(t, "a submit", func() bool { return len(srv.Tasks()) == 1 })
	id := srv.Tasks()[0]
	srv.StartAttempt(id, "m_a")
	srv.Log(id, stdout, "started")
	sdktest.WaitFor(t, "a follower", func() bool { return len(srv.Follows()) > 0 })
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "task "+id+" cancelled") {
		t.Errorf("err = %v", err)
	}
	if got := srv.Cancels(); len(got) != 1 || got[0] != id {
		t.Errorf("cancels = %v", got)
	}
	if res == nil || res.TaskID != id || res.State != v1.TaskState_TASK_STATE_CANCELLED {
		t.Errorf("result = %+v", res)
	}
}

func TestSubmitRefusalIsReadable(t *testing.T) {
	t.Parallel()
	srv, c := scripted(t, nil)
	_, err := c.Function("f", GPU(1, "")).Remote(context.Background(), "nvidia-smi")
	if status.Code(err) != codes.FailedPrecondition || err.Error() != "submit task: pool default has no GPUs" {
		t.Errorf("err = %q (%v)", err, status.Code(err))
	}
	if srv.Submits() != 1 {
		t.Errorf("a refused submit was retried: %d submits", srv.Submits())
	}
}
