package taskrun

import (
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
)

func TestStateTransitions(t *testing.T) {
	all := []State{StatePending, StatePulling, StateStarting, StateRunning, StateSucceeded, StateFailed, StateCancelled, StateTimedOut}
	legal := map[[2]State]bool{
		{StatePending, StatePulling}: true, {StatePending, StateFailed}: true, {StatePending, StateCancelled}: true,
		{StatePulling, StateStarting}: true, {StatePulling, StateFailed}: true, {StatePulling, StateCancelled}: true,
		{StateStarting, StateRunning}: true, {StateStarting, StateFailed}: true, {StateStarting, StateCancelled}: true,
		{StateRunning, StateSucceeded}: true, {StateRunning, StateFailed}: true, {StateRunning, StateCancelled}: true,
		{StateRunning, StateTimedOut}: true,
	}
	for _, from := range all {
		for _, to := range all {
			got, err := from.Next(to)
			if legal[[2]State{from, to}] {
				if err != nil || got != to {
					t.Errorf("%s -> %s = %s, %v; want legal", from, to, got, err)
				}
				continue
			}
			if err == nil || got != from || !errdefs.IsFailedPrecondition(err) {
				t.Errorf("%s -> %s = %s, %v; want refused with the state unchanged", from, to, got, err)
			}
		}
	}
	for _, tc := range []struct{ from, to State }{
		{"", StatePending}, {StatePending, "SCHEDULED"}, {"bogus", "bogus"},
	} {
		if _, err := tc.from.Next(tc.to); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q -> %q: %v, want invalid argument", tc.from, tc.to, err)
		}
	}
	for _, s := range all {
		if s.Terminal() != (s == StateSucceeded || s == StateFailed || s == StateCancelled || s == StateTimedOut) {
			t.Errorf("%s.Terminal() = %v", s, s.Terminal())
		}
	}
}

func TestTaskValidate(t *testing.T) {
	good := Task{ID: "t1", Attempt: 1, Image: "busybox:latest"}
	if err := good.Validate(); err != nil {
		t.Fatalf("good task: %v", err)
	}
	bad := Task{ID: "bad id!", Attempt: 0, Image: " ", Env: []string{"NOEQUALS"}, Cwd: "rel",
		GPUs: 1, Timeout: -1}
	err := bad.Validate()
	if !errdefs.IsInvalidArgument(err) || errdefs.IsRetryable(err) {
		t.Fatalf("bad task: %v, want a non-retryable invalid argument", err)
	}
	for _, field := range []string{"task.id", "task.attempt", "task.image", "task.env[0]", "task.cwd", "task.gpuDevices", "task.timeout"} {
		if !contains(err.Error(), field) {
			t.Errorf("error does not name %s: %v", field, err)
		}
	}
	withSec := good
	withSec.Security.Seccomp = "sometimes"
	if err := withSec.Validate(); err == nil || !contains(err.Error(), "task.security") {
		t.Errorf("bad seccomp: %v", err)
	}
}
