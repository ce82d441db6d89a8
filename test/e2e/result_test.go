package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTaskResultEndToEnd is the result channel on the real stack (the CLI
// binary, the controlplane, agent binaries on two machines, runc): run
// --input-file hands a file to the task as /run/levers9/io/input, the
// task's /run/levers9/io/result comes back with `task result`, byte for
// byte, to stdout or a file; a task that writes none says so; the input
// is not shown with the task; and no machine keeps an io directory once
// its attempts ended.
func TestTaskResultEndToEnd(t *testing.T) {
	w := setupTaskWorld(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "input.txt")
	if err := os.WriteFile(in, []byte("hello from the input file\nsecond line\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	r := w.start(t, "run", "--input-file", in, "--", "sh", "-c", "tr a-z A-Z < /run/levers9/io/input > /run/levers9/io/result")
	if code := r.wait(t, 90*time.Second); code != 0 {
		so, se := r.out()
		t.Fatalf("run: exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
	}
	ts := w.tasks(t)
	if len(ts) == 0 || ts[0].State != "TASK_STATE_SUCCEEDED" {
		t.Fatalf("newest task: %+v", ts)
	}
	id := ts[0].ID
	out, errOut, err := w.cli(t, "task", "result", id)
	if err != nil || out != "HELLO FROM THE INPUT FILE\nSECOND LINE\n" {
		t.Fatalf("task result: %v %q %q", err, out, errOut)
	}
	file := filepath.Join(dir, "result.txt")
	if out, errOut, err := w.cli(t, "task", "result", id, "-o", file); err != nil || out != "" {
		t.Fatalf("task result -o: %v %q %q", err, out, errOut)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "HELLO FROM THE INPUT FILE\nSECOND LINE\n" {
		t.Fatalf("result file: %q %v", b, err)
	}
	shown, _, err := w.cli(t, "task", "show", id, "-o", "json")
	if err != nil || strings.Contains(shown, `"input"`) {
		t.Errorf("task show carries the input: %v\n%s", err, shown)
	}

	// A task that writes no result: its io directory is there all the
	// same, and writable.
	r = w.start(t, "run", "--", "sh", "-c", "cat /run/levers9/io/input 2>/dev/null; touch /run/levers9/io/probe && echo writable")
	if code := r.wait(t, 90*time.Second); code != 0 {
		so, se := r.out()
		t.Fatalf("run without input: exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
	}
	if so, _ := r.out(); so != "writable\n" {
		t.Errorf("the io directory without input: %q", so)
	}
	none := w.tasks(t)[0].ID
	if _, errOut, err := w.cli(t, "task", "result", none); err == nil || !strings.Contains(errOut, "wrote no result") {
		t.Errorf("result of a task without one: %v %q", err, errOut)
	}

	for id, m := range w.runs {
		ents, err := os.ReadDir(filepath.Join(m.root, "state", "io"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if len(ents) != 0 {
			t.Errorf("machine %s keeps io directories after its attempts ended: %v", id, ents)
		}
	}
}
