package agent

import (
	"strings"
	"testing"

	"github.com/levers9/levers9/agent/taskrun"
	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
)

// TestTranslateMountValidation: the pool's pushed volume mount validation
// becomes the sandbox's, and a value the agent does not know is refused
// naming the config key.
func TestTranslateMountValidation(t *testing.T) {
	t.Parallel()
	attempt := func(mode string) *agentv1.TaskAttempt {
		return &agentv1.TaskAttempt{TaskId: "t_x", Attempt: 1, Pool: "default", Image: "busybox", Command: []string{"true"},
			Security: &v1.SecuritySettings{Profile: "hardened", Seccomp: "enforce", Runtime: "runc", VolumeMountValidation: mode}}
	}
	for mode, want := range map[string]sandbox.MountValidation{"enforce": sandbox.MountValidationEnforce, "log": sandbox.MountValidationLog, "": ""} {
		task, err := taskFromAttempt(attempt(mode), "default")
		if err != nil || task.Security.MountValidation != want {
			t.Errorf("pushed %q: mount validation %q (%v), want %q", mode, task.Security.MountValidation, err, want)
		}
	}
	_, err := taskFromAttempt(attempt("sometimes"), "default")
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "worker.volumeMountValidation") {
		t.Errorf("pushed %q: %v", "sometimes", err)
	}
}

// TestTranslateInput: the attempt's input reaches the task; more than the
// agent takes is refused naming the field.
func TestTranslateInput(t *testing.T) {
	t.Parallel()
	a := &agentv1.TaskAttempt{TaskId: "t_x", Attempt: 1, Pool: "default", Image: "busybox", Command: []string{"true"}, Input: []byte("pickled")}
	task, err := taskFromAttempt(a, "default")
	if err != nil || string(task.Input) != "pickled" {
		t.Fatalf("input %q, %v", task.Input, err)
	}
	a.Input = make([]byte, taskrun.MaxInputBytes+1)
	if _, err := taskFromAttempt(a, "default"); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "task.input") {
		t.Fatalf("an oversized input: %v", err)
	}
}
