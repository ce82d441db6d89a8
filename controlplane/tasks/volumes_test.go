package tasks_test

import (
	"strings"
	"testing"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
)

// TestJudgeMounts: under enforce a volume path no volume may take refuses
// the task, naming every such volume; under log each is a finding and the
// task goes on; safe paths are neither.
func TestJudgeMounts(t *testing.T) {
	spec := &v1.TaskSpec{Pool: "default", Volumes: []*v1.VolumeRef{
		{Name: "data", Path: "/data"}, {Name: "p", Path: "/proc"}, {Name: "e", Path: "/etc/app", ReadOnly: true},
	}}
	got, err := tasks.JudgeMounts(spec, sandbox.MountValidationLog)
	if err != nil || len(got) != 2 || got[0].Volume != "p" || got[0].Reason != "over /proc" || got[1].Path != "/etc/app" {
		t.Fatalf("log: %+v, %v", got, err)
	}
	got, err = tasks.JudgeMounts(spec, sandbox.MountValidationEnforce)
	if !errdefs.IsPermissionDenied(err) || got != nil {
		t.Fatalf("enforce: %+v, %v; want permission denied", got, err)
	}
	for _, want := range []string{"volume p at /proc: over /proc", "volume e at /etc/app: over /etc", "pool default", "enforce"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("enforce error %q lacks %q", err, want)
		}
	}
	spec.Volumes = spec.Volumes[:1]
	for _, mode := range []sandbox.MountValidation{sandbox.MountValidationLog, sandbox.MountValidationEnforce} {
		if got, err := tasks.JudgeMounts(spec, mode); err != nil || len(got) != 0 {
			t.Errorf("%s, a safe path: %+v, %v", mode, got, err)
		}
	}
}
