package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// TestImageBuild builds images from recipes on the real stack (two
// machines, runc, the registry): a recipe with env, copy and run steps
// gives an image a task runs with the files and environment; building it
// again is a cache hit (same reference, no new task); a changed last step
// rebuilds only that step; a failing step fails the build with its output;
// two builds of one recipe at once build once; and a clean rebuild on the
// other machine gives the same digest.
func TestImageBuild(t *testing.T) {
	w := setupTaskWorldWith(t, func(c *config.Config, w *taskWorld) {
		c.Worker.ImageRegistry = w.registry
	})
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "app", "hello.txt"), []byte("hi from a copied file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	recipe := func(file, last string) string {
		body := "base: " + w.registry + "/levers9/demo:e2e\nsteps:\n" +
			"  - env: {GREETING: hello-from-env}\n" +
			"  - copy: {src: ./app, dst: /app}\n" +
			"  - run: echo built > /built.txt && cat /app/hello.txt\n" +
			"  - run: " + last + "\n"
		p := filepath.Join(dir, file)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	refRE := regexp.MustCompile(`(?m)^(\S+/levers9/images@sha256:[0-9a-f]{64})$`)
	build := func(t *testing.T, file string, args ...string) (ref, out, errOut string) {
		t.Helper()
		out, errOut, err := w.cli(t, append([]string{"image", "build", "-f", file}, args...)...)
		if err != nil {
			t.Fatalf("image build: %v\n%s\n%s", err, out, errOut)
		}
		m := refRE.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("image build printed no reference:\n%s\n%s", out, errOut)
		}
		return m[1], out, errOut
	}

	first := recipe("image.yaml", "echo four > /four.txt")
	ref, out, errOut := build(t, first)
	for _, want := range []string{"step 1/4: env GREETING", "step 2/4: copy ./app to /app", "step 3/4: run", "hi from a copied file", "step 4/4: run"} {
		if !strings.Contains(out, want) {
			t.Errorf("build output lacks %q:\n%s\n%s", want, out, errOut)
		}
	}

	t.Run("a task runs on the image", func(t *testing.T) {
		out, errOut, err := w.cli(t, "run", "--image", ref, "--", "sh", "-c", `cat /app/hello.txt /built.txt /four.txt; echo "$GREETING"`)
		if err != nil {
			t.Fatalf("run: %v\n%s\n%s", err, out, errOut)
		}
		for _, want := range []string{"hi from a copied file", "built", "four", "hello-from-env"} {
			if !strings.Contains(out, want) {
				t.Errorf("task output lacks %q:\n%s", want, out)
			}
		}
		out, errOut, err = w.cli(t, "run", "--image-file", first, "--", "cat", "/built.txt")
		if err != nil || strings.TrimSpace(out) != "built" {
			t.Fatalf("run --image-file: %v\n%s\n%s", err, out, errOut)
		}
	})

	t.Run("the same recipe again is a cache hit", func(t *testing.T) {
		tasksBefore := w.taskCount(t)
		again, out, errOut := build(t, first)
		if again != ref || !strings.Contains(errOut, "(cached)") || strings.Contains(out, "step ") {
			t.Fatalf("second build: ref %s (first %s)\n%s\n%s", again, ref, out, errOut)
		}
		if n := w.taskCount(t); n != tasksBefore {
			t.Fatalf("a cached build started a task: %d tasks, %d before", n, tasksBefore)
		}
	})

	t.Run("a changed last step rebuilds only it", func(t *testing.T) {
		changed := recipe("changed.yaml", "echo four-b > /four.txt")
		ref2, out, errOut := build(t, changed)
		if ref2 == ref {
			t.Fatal("a changed step gave the same image")
		}
		if !strings.Contains(errOut, "(3 of 4 steps cached)") || !strings.Contains(out, "steps 1-3 of 4: cached") ||
			strings.Contains(out, "step 3/4") || !strings.Contains(out, "step 4/4: run echo four-b") {
			t.Fatalf("rebuild did more than the last step:\n%s\n%s", out, errOut)
		}
		out, _, err := w.cli(t, "run", "--image", ref2, "--", "cat", "/four.txt", "/built.txt")
		if err != nil || !strings.Contains(out, "four-b") || !strings.Contains(out, "built") {
			t.Fatalf("task on the rebuilt image: %v\n%s", err, out)
		}
	})

	t.Run("a failing step fails the build with its output", func(t *testing.T) {
		bad := recipe("bad.yaml", "echo boom-output; exit 3")
		out, errOut, err := w.cli(t, "image", "build", "-f", bad)
		if err == nil {
			t.Fatalf("a failing step built:\n%s\n%s", out, errOut)
		}
		all := out + errOut
		if !strings.Contains(all, "boom-output") || !strings.Contains(all, "step 4/4 (run echo boom-output; exit 3) failed with exit code 3") {
			t.Fatalf("the failure does not say which step or show its output:\n%s\n%s", out, errOut)
		}
		list, _, err := w.cli(t, "image", "list")
		if err != nil || !strings.Contains(list, "failed") {
			t.Fatalf("image list: %v\n%s", err, list)
		}
	})

	t.Run("a copy keeps the image's directories", func(t *testing.T) {
		p := filepath.Join(dir, "tmpcopy.yaml")
		body := "base: " + w.registry + "/levers9/demo:e2e\nsteps:\n  - copy: {src: ./app, dst: /tmp/app}\n"
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		ref, _, _ := build(t, p)
		out, errOut, err := w.cli(t, "run", "--image", ref, "--", "stat", "-c", "%a %n", "/tmp", "/tmp/app")
		if err != nil || !strings.Contains(out, "1777 /tmp\n") || !strings.Contains(out, "755 /tmp/app") {
			t.Fatalf("modes after a copy under /tmp: %v\n%s\n%s", err, out, errOut)
		}
	})

	t.Run("two builds at once build once", func(t *testing.T) {
		twice := recipe("twice.yaml", "echo twice > /twice.txt")
		tasksBefore := w.taskCount(t)
		var wg sync.WaitGroup
		refs := make([]string, 2)
		errs := make([]string, 2)
		for i := range refs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, errOut, err := w.cli(t, "image", "build", "-f", twice)
				if m := refRE.FindStringSubmatch(out); err == nil && m != nil {
					refs[i] = m[1]
				}
				errs[i] = errOut
			}()
		}
		wg.Wait()
		if refs[0] == "" || refs[0] != refs[1] {
			t.Fatalf("concurrent builds: %q %q\n%s\n%s", refs[0], refs[1], errs[0], errs[1])
		}
		if n := w.taskCount(t); n != tasksBefore+1 {
			t.Fatalf("two builds of one recipe made %d tasks", n-tasksBefore)
		}
	})

	t.Run("a clean build on the other machine gives the same digest", func(t *testing.T) {
		builder := w.buildMachine(t, errOut)
		m := regexp.MustCompile(`images@sha256:([0-9a-f]{12})`).FindStringSubmatch(ref)
		list, _, _ := w.cli(t, "image", "list")
		hash := ""
		for _, line := range strings.Split(list, "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[1] == "ready" && strings.Contains(w.imageRef(t, f[0]), m[1]) {
				hash = f[0]
			}
		}
		if hash == "" {
			t.Fatalf("no ready image with digest %s in:\n%s", m[1], list)
		}
		if out, errOut, err := w.cli(t, "image", "delete", hash); err != nil {
			t.Fatalf("image delete: %v\n%s\n%s", err, out, errOut)
		}
		// The machine that built it first is away, so the other one
		// builds every step again from the base.
		w.kill(t, builder)
		defer func() {
			w.startAgent(t, w.runs[builder])
			w.waitMachine(t, builder, "MACHINE_STATE_ONLINE")
		}()
		w.waitMachine(t, builder, "MACHINE_STATE_OFFLINE")
		again, out, errOut := build(t, first)
		if other := w.buildMachine(t, errOut); other == builder {
			t.Fatalf("the rebuild ran on %s again: %+v\n%s", builder, w.machines(t), errOut)
		}
		if again != ref || !strings.Contains(errOut, "(0 of 4 steps cached)") {
			t.Fatalf("clean rebuild on the other machine: %s, first %s\n%s\n%s", again, ref, out, errOut)
		}
	})
}

// buildMachine is the machine that ran the build whose `image build`
// stderr is errOut.
func (w *taskWorld) buildMachine(t *testing.T, errOut string) string {
	t.Helper()
	m := regexp.MustCompile(`in task (t_[a-z2-7]+)`).FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("image build named no task:\n%s", errOut)
	}
	atts := w.showAttempts(t, m[1])
	if len(atts) == 0 {
		t.Fatalf("build task %s has no attempts", m[1])
	}
	return atts[len(atts)-1].MachineID
}

// waitMachine waits for a machine to reach a state.
func (w *taskWorld) waitMachine(t *testing.T, id, state string) {
	t.Helper()
	controlplanetest.Eventually(t, 60*time.Second, id+" "+state, func() bool {
		for _, m := range w.machines(t) {
			if m.ID == id {
				return m.State == state
			}
		}
		return false
	})
}

// taskCount is how many tasks the workspace has.
func (w *taskWorld) taskCount(t *testing.T) int {
	t.Helper()
	out, errOut, err := w.cli(t, "task", "list", "--limit", "1000")
	if err != nil {
		t.Fatalf("task list: %v\n%s", err, errOut)
	}
	return len(regexp.MustCompile(`(?m)^t_[a-z2-7]+`).FindAllString(out, -1))
}

// imageRef is the reference image show gives for a hash.
func (w *taskWorld) imageRef(t *testing.T, hash string) string {
	t.Helper()
	out, errOut, err := w.cli(t, "image", "show", hash)
	if err != nil {
		t.Fatalf("image show %s: %v\n%s", hash, err, errOut)
	}
	return out
}
