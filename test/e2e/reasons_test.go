package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// shownAttempt is an attempt as `task show -o json` prints it.
type shownAttempt struct {
	Number    int    `json:"number"`
	State     string `json:"state"`
	MachineID string `json:"machineId"`
	ExitCode  *int   `json:"exitCode"`
	Message   string `json:"message"`
	Reason    string `json:"reason"`
	Summary   string `json:"summary"`
}

func (w *taskWorld) showAttempts(t *testing.T, id string) []shownAttempt {
	t.Helper()
	var resp struct {
		Task struct {
			Attempts []shownAttempt `json:"attempts"`
		} `json:"task"`
	}
	w.cliJSON(t, &resp, "task", "show", id)
	return resp.Task.Attempts
}

// TestTaskFailureReasons: a platform failure is a reason, not an exit
// code, and an OOM kill says so.
func TestTaskFailureReasons(t *testing.T) {
	w := setupTaskWorld(t)

	t.Run("missing image", func(t *testing.T) {
		img := w.registry + "/levers9/missing:1"
		r := w.start(t, "run", "--image", img, "--retries", "2", "--", "true")
		code := r.wait(t, 90*time.Second)
		so, se := r.out()
		ts := w.tasks(t)
		atts := w.showAttempts(t, ts[0].ID)
		raw, _ := json.Marshal(atts)
		want := "could not start on machine"
		if code != 1 || !strings.Contains(se, want) || !strings.Contains(se, img+" was not found") || strings.Contains(se, "MANIFEST_UNKNOWN") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		t.Logf("levers9 run said: %s", strings.TrimSpace(se))
		// One attempt: no other machine would find the image either.
		if len(atts) != 1 || atts[0].Reason != "FAILURE_REASON_IMAGE_NOT_FOUND" || atts[0].ExitCode != nil || !strings.Contains(atts[0].Message, "MANIFEST_UNKNOWN") {
			t.Fatalf("attempts: %s", raw)
		}
	})

	t.Run("out of memory", func(t *testing.T) {
		r := w.start(t, "run", "--memory", "16Mi", "--", "sh", "-c", "head -c 200000000 /dev/zero | tail")
		code := r.wait(t, 90*time.Second)
		so, se := r.out()
		if code != 137 || !strings.Contains(se, "out of memory: limit 16 MiB") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		t.Logf("levers9 run said: %s", strings.TrimSpace(se))
		ts := w.tasks(t)
		atts := w.showAttempts(t, ts[0].ID)
		raw, _ := json.Marshal(atts)
		if len(atts) != 1 || atts[0].Reason != "FAILURE_REASON_OUT_OF_MEMORY" || atts[0].ExitCode == nil || *atts[0].ExitCode != 137 {
			t.Fatalf("attempts: %s", raw)
		}
		out, _, err := w.cli(t, "task", "show", ts[0].ID)
		if err != nil || !strings.Contains(out, "out of memory: limit 16 MiB") {
			t.Fatalf("task show: %v\n%s", err, out)
		}
	})

	t.Run("start failure retries on another machine", func(t *testing.T) {
		// Break both machines' container bundles directory: the runtime
		// cannot be given a bundle, a fault of the machine, not the task.
		var dirs []string
		for _, m := range w.runs {
			d := filepath.Join(m.root, "state", "containers", "bundles")
			if err := os.RemoveAll(d); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Dir(d), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(d, []byte("not a directory"), 0o600); err != nil {
				t.Fatal(err)
			}
			dirs = append(dirs, d)
		}
		t.Cleanup(func() {
			for _, d := range dirs {
				_ = os.Remove(d)
			}
		})
		r := w.start(t, "run", "--retries", "1", "--", "true")
		code := r.wait(t, 90*time.Second)
		so, se := r.out()
		t.Logf("levers9 run said: %s", strings.TrimSpace(se))
		if code != 1 || !strings.Contains(se, "could not start on machine") || !strings.Contains(se, "attempt 2") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		ts := w.tasks(t)
		atts := w.showAttempts(t, ts[0].ID)
		raw, _ := json.Marshal(atts)
		if len(atts) != 2 || atts[0].MachineID == atts[1].MachineID {
			t.Fatalf("want two attempts on two machines: %s", raw)
		}
		for _, a := range atts {
			if a.State != "ATTEMPT_STATE_FAILED" || a.Reason != "FAILURE_REASON_START_FAILED" || a.ExitCode != nil {
				t.Fatalf("attempts: %s", raw)
			}
		}
		if ts[0].State != "TASK_STATE_FAILED" {
			t.Fatalf("task: %+v", ts[0])
		}
	})
}
