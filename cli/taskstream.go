package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"golang.org/x/term"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sdk"
)

// streamPrinter writes a followed task's output as if it ran here: stdout
// lines to stdout, stderr lines to stderr, and marker lines ("--- …",
// dim on a terminal) on stderr where a new attempt began or lines were
// dropped.
type streamPrinter struct {
	out, err io.Writer
	dim      bool
	// ended is how the latest finished attempt ended, for the next
	// attempt's marker.
	ended map[int32]string
	// last is the latest task state seen.
	last *v1.StateChange
}

func newStreamPrinter(out, errw io.Writer, dim bool) *streamPrinter {
	return &streamPrinter{out: out, err: errw, ended: map[int32]string{}, dim: dim}
}

// isTerminal reports whether w is a terminal (markers are dim there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// lockedWriter serialises writes from the follower and the interrupt
// handler.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// marker prints one marker line on stderr.
func (p *streamPrinter) marker(format string, args ...any) {
	line := "--- " + fmt.Sprintf(format, args...)
	if p.dim {
		line = "\x1b[2m" + line + "\x1b[0m"
	}
	fmt.Fprintln(p.err, line)
}

func (p *streamPrinter) event(ev *sdk.TaskEvent) error {
	if l := ev.GetLog(); l != nil {
		if n := l.GetDroppedBefore(); n > 0 {
			p.marker("%d lines dropped here (output came faster than it could be shipped)", n)
		}
		w := p.out
		if l.GetStream() == v1.LogStream_LOG_STREAM_STDERR {
			w = p.err
		}
		_, err := fmt.Fprintln(w, l.GetText())
		return err
	}
	if m := ev.GetMounts(); m != nil {
		for _, f := range m.GetFindings() {
			p.marker("volume %s at %s: %s; worker.volumeMountValidation log let it through, enforce would refuse it", f.GetVolume(), f.GetPath(), f.GetReason())
		}
		return nil
	}
	s := ev.GetState()
	if s == nil {
		return nil
	}
	p.last = s
	if s.GetNewAttempt() {
		prev := ev.GetAttempt() - 1
		how := p.ended[prev]
		if how == "" {
			how = "ended"
		}
		machine := s.GetMachineId()
		if machine == "" {
			machine = "(not placed yet)"
		}
		p.marker("attempt %d on machine %s (attempt %d %s)", ev.GetAttempt(), machine, prev, how)
	}
	if as := s.GetAttemptState(); isAttemptEnd(as) {
		how := sdk.AttemptStateName(as)
		// The controlplane words it "attempt 1 lost: why; retrying"; the
		// marker already says the attempt and that a new one began.
		msg := strings.TrimPrefix(s.GetMessage(), fmt.Sprintf("attempt %d %s: ", ev.GetAttempt(), how))
		if msg = strings.TrimSuffix(msg, "; retrying"); msg != "" {
			how += ": " + msg
		}
		p.ended[ev.GetAttempt()] = how
	}
	return nil
}

func isAttemptEnd(s v1.AttemptState) bool {
	switch s {
	case v1.AttemptState_ATTEMPT_STATE_SUCCEEDED, v1.AttemptState_ATTEMPT_STATE_FAILED, v1.AttemptState_ATTEMPT_STATE_CANCELLED,
		v1.AttemptState_ATTEMPT_STATE_TIMED_OUT, v1.AttemptState_ATTEMPT_STATE_LOST:
		return true
	}
	return false
}

// exitFor maps a finished task to the CLI's exit: the task's exit code,
// 124 for a timeout (as timeout(1) does), 1 with a message for anything
// else that did not succeed.
func exitFor(t *v1.Task) error {
	switch t.GetState() {
	case v1.TaskState_TASK_STATE_SUCCEEDED:
		return nil
	case v1.TaskState_TASK_STATE_TIMED_OUT:
		return &exitError{code: 124, msg: taskErrText(t)}
	case v1.TaskState_TASK_STATE_FAILED:
		if c := t.GetExitCode(); c > 0 && c < 256 {
			// Like a local command: the code speaks, the task's stderr
			// already said why; unless a limit killed it, which the
			// program could not say.
			if n := len(t.GetAttempts()); n > 0 && t.GetAttempts()[n-1].GetSummary() != "" {
				return &exitError{code: int(c), msg: taskErrText(t)}
			}
			return &exitError{code: int(c)}
		}
	}
	return &exitError{code: 1, msg: taskErrText(t)}
}

func taskErrText(t *v1.Task) string {
	if err := sdk.ErrorOf(t); err != nil {
		return err.Error()
	}
	return ""
}
