package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image/build"
)

// demoImage starts a registry where the boxes reach the host, pushes a
// busybox image to it, and makes it the image of tasks that name none.
func (w *taskWorld) demoImage(t *testing.T, c *config.Config) {
	t.Helper()
	reg, err := devstack.StartRegistry(context.Background(), filepath.Join(t.TempDir(), "registry"), c.Controlplane.PublicHost, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop() })
	w.registry = reg.Addr()
	res, err := build.BuildBusybox(context.Background(), reg.Addr(), "levers9/demo", "e2e", nil, build.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Worker.DefaultImage = res.Ref
}

// restartWorld is a controlplane with one machine, its agent run by the
// join script in a box, which the tests stop and start again.
type restartWorld struct {
	*taskWorld
	id   string
	stop func()
	// out is the output of the agent's join script since its last start.
	out *testenv.SyncBuffer
	// root is the test that owns the agent processes: an agent started
	// in a subtest outlives it.
	root *testing.T
}

func setupRestartWorld(t *testing.T, grace string) *restartWorld {
	t.Helper()
	w := &taskWorld{runs: map[string]machineRun{}}
	w.joinWorld = setupJoinWorldWith(t, func(c *config.Config) {
		c.Controlplane.LostAgentGrace = grace
		w.demoImage(t, c)
	})
	w.boxes = []*box{w.joinWorld.box}
	out, errOut, err := w.cli(t, "machine", "create", "--pool", "default", "--name", "restarts")
	if err != nil {
		t.Fatalf("machine create: %v %s", err, errOut)
	}
	id := regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)[1]
	w.runs[id] = machineRun{box: w.boxes[0], script: filepath.Join(w.home, "machines", id+".sh"), root: filepath.Join(t.TempDir(), "box")}
	rw := &restartWorld{taskWorld: w, id: id, root: t}
	rw.startAgent(t)
	return rw
}

// startAgent starts the agent (joining the first time) and waits until the
// machine is online.
func (w *restartWorld) startAgent(t *testing.T) {
	t.Helper()
	m := w.runs[w.id]
	w.stop, w.out = w.runScript(w.root, m.script, m.root, "--", "--insecure-registries", w.registry)
	controlplanetest.Eventually(t, 60*time.Second, "the machine online", func() bool {
		for _, m := range w.machines(t) {
			if m.ID == w.id {
				return m.State == "MACHINE_STATE_ONLINE"
			}
		}
		return false
	})
}

// countingTask prints line1..lineN, one every 200 ms, then exits 7.
func countingTask(n int) []string {
	return []string{"run", "--", "sh", "-c", fmt.Sprintf("i=1; while [ $i -le %d ]; do echo line$i; i=$((i+1)); sleep 0.2; done; exit 7", n)}
}

func wantLines(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "line%d\n", i)
	}
	return b.String()
}

// TestAgentRestartKeepsTasks stops the agent in the middle of a task that
// prints for about 10 s and starts it again: the task keeps running, its
// output arrives complete (every line once, in order, also those printed
// while no agent ran) and its exit code is right.
func TestAgentRestartKeepsTasks(t *testing.T) {
	w := setupRestartWorld(t, "60s")
	for _, tc := range []struct {
		name string
		stop func(t *testing.T)
	}{
		{"SIGTERM", func(t *testing.T) { w.stop() }},
		{"SIGKILL", func(t *testing.T) { w.kill(t, w.id) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 50
			r := w.start(t, countingTask(n)...)
			deadline := time.Now().Add(60 * time.Second)
			for so, _ := r.out(); !strings.Contains(so, "line5\n"); so, _ = r.out() {
				if time.Now().After(deadline) {
					so, se := r.out()
					logs := w.in.Logs.String()
					t.Fatalf("task did not start\nstdout:\n%s\nstderr:\n%s\ntasks: %+v\nagent:\n%s\ncontrolplane:\n%s", so, se, w.tasks(t), w.out.String(), logs[max(0, len(logs)-20000):])
				}
				time.Sleep(100 * time.Millisecond)
			}
			tc.stop(t)
			// Lines printed while no agent runs must be shipped too.
			time.Sleep(2 * time.Second)
			w.startAgent(t)
			code := r.wait(t, 120*time.Second)
			so, se := r.out()
			if code != 7 || so != wantLines(n) {
				t.Fatalf("exit %d (want 7)\nstdout:\n%s\nstderr:\n%s", code, so, se)
			}
			ts := w.tasks(t)
			if len(ts[0].Attempts) != 1 {
				t.Fatalf("attempts: %+v", ts[0].Attempts)
			}
		})
	}
}

// containerRunning reports whether a process `sh -c SCRIPT` whose script
// holds marker runs on the host (the container's, not the CLI's).
func containerRunning(t *testing.T, marker string) bool {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) >= 3 && args[0] == "sh" && args[1] == "-c" && strings.Contains(args[2], marker) {
			return true
		}
	}
	return false
}

// TestAgentLeaseStopsPartitionedTasks cuts the agent off the controlplane
// (the controlplane stops) while a task runs: once the lease (the
// controlplane's lostAgentGrace) runs out, the agent kills the container,
// since the controlplane gives the attempt up and may run it elsewhere.
func TestAgentLeaseStopsPartitionedTasks(t *testing.T) {
	w := setupRestartWorld(t, "4s")
	marker := fmt.Sprintf("lease-%d", time.Now().UnixNano())
	r := w.start(t, "run", "--", "sh", "-c", "echo "+marker+"; while true; do echo tick; sleep 0.2; done")
	controlplanetest.Eventually(t, 60*time.Second, "task started", func() bool {
		so, _ := r.out()
		return strings.Contains(so, marker)
	})
	if !containerRunning(t, marker) {
		t.Fatal("no container process found for the running task")
	}
	// The lease is not a timeout: a connected agent keeps its task.
	time.Sleep(6 * time.Second)
	if !containerRunning(t, marker) {
		t.Fatalf("the task's container stopped while its agent was connected\nagent:\n%s", w.out.String())
	}
	w.in.Server.Stop()
	stopped := time.Now()
	// Lease (4 s), then the kill's grace (10 s) before SIGKILL.
	deadline := time.Now().Add(40 * time.Second)
	for containerRunning(t, marker) {
		if time.Now().After(deadline) {
			t.Fatalf("the container still runs %s after the controlplane went away\nagent:\n%s", time.Since(stopped).Round(time.Second), w.out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if gone := time.Since(stopped); gone < 4*time.Second {
		t.Fatalf("the container stopped %s after the controlplane went away, before the lease ran out", gone)
	}
	if !strings.Contains(w.out.String(), "lease expired") {
		t.Fatalf("the agent did not say why it killed the task\nagent:\n%s", w.out.String())
	}
}
