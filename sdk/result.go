package sdk

import (
	"fmt"
	"strings"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// Result is what a finished task gave back.
type Result struct {
	TaskID string
	State  v1.TaskState
	// ExitCode is the final attempt's exit code; nil when it ended without
	// one (lost, refused, cancelled before its program ran).
	ExitCode *int
	// Stdout and Stderr are the task's output lines, each ending in "\n",
	// bounded to their last MaxOutput bytes; the Truncated flags say when
	// earlier output was left out.
	Stdout, Stderr                   string
	StdoutTruncated, StderrTruncated bool
	// DroppedLines counts lines the agent dropped because the controlplane
	// fell behind (the container is never blocked on its output).
	DroppedLines uint64
	// Attempts is how many attempts the task took (more than one when a
	// machine running it was lost).
	Attempts int
	// Message says why the task ended as it did when that was not an exit
	// code.
	Message string
	// Reason says why the final attempt failed when its exit code does
	// not (it never started, or a limit killed it); Summary says it in one
	// sentence ("out of memory: limit 64 MiB").
	Reason  v1.FailureReason
	Summary string
}

// TaskError says why a task did not succeed. Remote and Wait return it with
// the Result.
type TaskError struct {
	Function string
	TaskID   string
	State    v1.TaskState
	// ExitCode is set when the task exited non-zero.
	ExitCode int
	Message  string
	// Lost is true when the last attempt's machine went away and no
	// retries were left.
	Lost     bool
	Attempts int
	// Timeout is the task's run time limit, for a timed-out task.
	Timeout time.Duration
	// Reason and Summary are the final attempt's failure reason and its
	// one sentence; MachineID is where that attempt ran.
	Reason    v1.FailureReason
	Summary   string
	MachineID string
}

// NotStarted reports whether r means the program never ran (the attempt
// has no exit code).
func NotStarted(r v1.FailureReason) bool {
	switch r {
	case v1.FailureReason_FAILURE_REASON_START_FAILED, v1.FailureReason_FAILURE_REASON_IMAGE_NOT_FOUND,
		v1.FailureReason_FAILURE_REASON_IMAGE_PULL_FAILED, v1.FailureReason_FAILURE_REASON_MOUNT_FAILED,
		v1.FailureReason_FAILURE_REASON_NETWORK_FAILED:
		return true
	}
	return false
}

func (e *TaskError) Error() string {
	var b strings.Builder
	if e.Function != "" {
		fmt.Fprintf(&b, "function %s: ", e.Function)
	}
	fmt.Fprintf(&b, "task %s ", e.TaskID)
	on := ""
	if e.MachineID != "" {
		on = " on machine " + e.MachineID
	}
	switch {
	case e.State == v1.TaskState_TASK_STATE_FAILED && e.Summary != "" && NotStarted(e.Reason):
		// One sentence; the full chain is in the attempt's message.
		fmt.Fprintf(&b, "could not start%s: %s", on, e.Summary)
		return b.String()
	case e.State == v1.TaskState_TASK_STATE_FAILED && e.Summary != "" && e.Reason != v1.FailureReason_FAILURE_REASON_UNSPECIFIED:
		fmt.Fprintf(&b, "was killed%s (exit code %d): %s", on, e.ExitCode, e.Summary)
		return b.String()
	case e.State == v1.TaskState_TASK_STATE_CANCELLED:
		b.WriteString("was cancelled")
	case e.State == v1.TaskState_TASK_STATE_TIMED_OUT && e.Timeout > 0:
		fmt.Fprintf(&b, "timed out after %s", e.Timeout)
	case e.State == v1.TaskState_TASK_STATE_TIMED_OUT:
		b.WriteString("timed out")
	case e.Lost:
		fmt.Fprintf(&b, "lost its machine on attempt %d with no retries left", e.Attempts)
	case e.State == v1.TaskState_TASK_STATE_FAILED && e.ExitCode != 0:
		fmt.Fprintf(&b, "exited with code %d", e.ExitCode)
	case e.State == v1.TaskState_TASK_STATE_FAILED:
		b.WriteString("failed")
	default:
		fmt.Fprintf(&b, "ended in state %s", StateName(e.State))
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// ErrorOf is nil for a succeeded task and a *TaskError saying what
// happened otherwise (also for a task that has not finished yet).
func ErrorOf(t *v1.Task) error {
	if t.GetState() == v1.TaskState_TASK_STATE_SUCCEEDED {
		return nil
	}
	e := &TaskError{TaskID: t.GetId(), State: t.GetState(), ExitCode: int(t.GetExitCode()), Message: t.GetMessage(),
		Attempts: len(t.GetAttempts()), Timeout: t.GetSpec().GetTimeout().AsDuration()}
	if n := len(t.GetAttempts()); n > 0 {
		last := t.GetAttempts()[n-1]
		e.Lost = last.GetState() == v1.AttemptState_ATTEMPT_STATE_LOST
		e.Reason, e.Summary, e.MachineID = last.GetReason(), last.GetSummary(), last.GetMachineId()
		if e.Message == "" {
			e.Message = last.GetMessage()
		}
	}
	return e
}

// StateName is a task state in lower case without its prefix ("running").
func StateName(s v1.TaskState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "TASK_STATE_"))
}

// AttemptStateName is an attempt state in lower case ("lost").
func AttemptStateName(s v1.AttemptState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "ATTEMPT_STATE_"))
}

// tail keeps the last max bytes of output, in whole lines where it can.
type tail struct {
	max       int
	lines     []string
	size      int
	truncated bool
}

func newTail(max int) *tail { return &tail{max: max} }

func (t *tail) add(line string) {
	line += "\n"
	if len(line) > t.max {
		line = line[len(line)-t.max:]
		t.truncated = true
	}
	t.lines = append(t.lines, line)
	t.size += len(line)
	drop := 0
	for t.size > t.max {
		t.size -= len(t.lines[drop])
		drop++
		t.truncated = true
	}
	if drop > 0 {
		// Copy down so the backing array does not grow without bound.
		t.lines = append(t.lines[:0], t.lines[drop:]...)
	}
}

func (t *tail) String() string { return strings.Join(t.lines, "") }
