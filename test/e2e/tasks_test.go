package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/agent"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/testenv"
)

// taskWorld is the whole stack: a controlplane with Postgres and Redis, an
// image registry, and two machines, each a network namespace running the
// real agent binary that its join script downloaded, with runc.
type taskWorld struct {
	*joinWorld
	boxes    []*box
	runs     map[string]machineRun // machine ID -> how its agent runs
	registry string
	// insecure lists further plain-HTTP registries the agents may pull
	// from (set by setupTaskWorldWith's mutate).
	insecure []string
	// agentLogs is every agent's output, in start order.
	agentLogs []*testenv.SyncBuffer
}

func setupTaskWorld(t *testing.T) *taskWorld {
	t.Helper()
	return setupTaskWorldWith(t, nil)
}

// setupTaskWorldWith is setupTaskWorld with mutate run on the config and
// the world before any agent starts.
func setupTaskWorldWith(t *testing.T, mutate func(*config.Config, *taskWorld)) *taskWorld {
	t.Helper()
	w := &taskWorld{runs: map[string]machineRun{}}
	w.joinWorld = setupJoinWorldWith(t, func(c *config.Config) {
		// Long enough for the controlplane restart below: an agent that
		// reaches no controlplane for longer kills its tasks (its lease).
		c.Controlplane.LostAgentGrace = "15s"
		w.demoImage(t, c)
		if mutate != nil {
			mutate(c, w)
		}
	})
	b1 := w.joinWorld.box
	b2 := newBox(t)
	for b2.hostIP == b1.hostIP {
		b2 = newBox(t)
	}
	// The second box reaches the controlplane (on the first box's host
	// address) through its own link.
	ip(t, "-n", b2.ns, "route", "add", b1.hostIP+"/32", "via", b2.hostIP)
	w.boxes = []*box{b1, b2}
	for i, b := range w.boxes {
		out, errOut, err := w.cli(t, "machine", "create", "--pool", "default", "--name", fmt.Sprintf("box-%d", i))
		if err != nil {
			t.Fatalf("machine create: %v %s", err, errOut)
		}
		id := regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)[1]
		m := machineRun{box: b, script: filepath.Join(w.home, "machines", id+".sh"), root: filepath.Join(t.TempDir(), fmt.Sprintf("box%d", i))}
		w.runs[id] = m
		w.startAgent(t, m)
	}
	controlplanetest.Eventually(t, 60*time.Second, "both machines online", func() bool {
		online := 0
		for _, m := range w.machines(t) {
			if m.State == "MACHINE_STATE_ONLINE" {
				online++
			}
		}
		return online == 2
	})
	return w
}

type machineRun struct {
	box          *box
	script, root string
}

// startAgent runs a machine's join script in its box: the first time it
// joins, later it only starts the agent again.
func (w *taskWorld) startAgent(t *testing.T, m machineRun) {
	t.Helper()
	w.joinWorld.box = m.box
	_, out := w.runScript(t, m.script, m.root, "--", "--insecure-registries", strings.Join(append([]string{w.registry}, w.insecure...), ","))
	w.agentLogs = append(w.agentLogs, out)
	w.joinWorld.box = w.boxes[0]
}

// runCLI starts `levers9 args...` and returns its output as it comes.
type running struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stdout strings.Builder
	stderr strings.Builder
	done   chan struct{}
	err    error
}

func (w *taskWorld) start(t *testing.T, args ...string) *running {
	t.Helper()
	r := &running{done: make(chan struct{})}
	r.cmd = exec.Command(filepath.Join(bin, "levers9"), args...)
	r.cmd.Env = append(os.Environ(), "LEVERS9_HOME="+w.home)
	so, _ := r.cmd.StdoutPipe()
	se, _ := r.cmd.StderrPipe()
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	copyTo := func(sb *strings.Builder, rd interface{ Read([]byte) (int, error) }) {
		defer wg.Done()
		sc := bufio.NewScanner(rd)
		for sc.Scan() {
			r.mu.Lock()
			sb.WriteString(sc.Text() + "\n")
			r.mu.Unlock()
		}
	}
	wg.Add(2)
	go copyTo(&r.stdout, so)
	go copyTo(&r.stderr, se)
	go func() { wg.Wait(); r.err = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() { _ = r.cmd.Process.Kill(); <-r.done })
	return r
}

func (r *running) out() (string, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stdout.String(), r.stderr.String()
}

// wait returns the exit code.
func (r *running) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(within):
		so, se := r.out()
		t.Fatalf("levers9 did not exit within %s\nstdout:\n%s\nstderr:\n%s", within, so, se)
	}
	var ee *exec.ExitError
	if errors.As(r.err, &ee) {
		return ee.ExitCode()
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	return 0
}

type shownTask struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	ExitCode int    `json:"exitCode"`
	Message  string `json:"message"`
	Attempts []struct {
		Number    int    `json:"number"`
		State     string `json:"state"`
		MachineID string `json:"machineId"`
	} `json:"attempts"`
}

func (w *taskWorld) tasks(t *testing.T) []shownTask {
	t.Helper()
	var resp struct {
		Tasks []shownTask `json:"tasks"`
	}
	w.cliJSON(t, &resp, "task", "list")
	return resp.Tasks
}

func TestTasksEndToEnd(t *testing.T) {
	w := setupTaskWorld(t)

	t.Run("output and exit code", func(t *testing.T) {
		r := w.start(t, "run", "--", "sh", "-c", "echo hello from the box; echo to stderr >&2; exit 3")
		code := r.wait(t, 90*time.Second)
		so, se := r.out()
		if code != 3 || !strings.Contains(so, "hello from the box\n") || !strings.Contains(se, "to stderr") || strings.Contains(so, "to stderr") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
	})

	t.Run("GPU on a pool without GPUs is refused", func(t *testing.T) {
		r := w.start(t, "run", "--gpu", "1", "--", "true")
		code := r.wait(t, 30*time.Second)
		_, se := r.out()
		if code == 0 || !strings.Contains(se, "has no GPUs") {
			t.Fatalf("exit %d, stderr:\n%s", code, se)
		}
	})

	t.Run("timeout kills", func(t *testing.T) {
		r := w.start(t, "run", "--timeout", "2s", "--", "sleep", "60")
		code := r.wait(t, 60*time.Second)
		_, se := r.out()
		if code != 124 {
			t.Fatalf("exit %d, stderr:\n%s", code, se)
		}
	})

	t.Run("cancel kills", func(t *testing.T) {
		r := w.start(t, "run", "--", "sh", "-c", "echo started; sleep 120")
		controlplanetest.Eventually(t, 60*time.Second, "task started", func() bool {
			so, _ := r.out()
			return strings.Contains(so, "started")
		})
		_ = r.cmd.Process.Signal(syscall.SIGINT)
		code := r.wait(t, 30*time.Second)
		_, se := r.out()
		if code == 0 {
			t.Fatalf("cancelled run exited 0; stderr:\n%s", se)
		}
		ts := w.tasks(t)
		if len(ts) == 0 || ts[0].State != "TASK_STATE_CANCELLED" {
			t.Fatalf("newest task: %+v", ts)
		}
	})

	t.Run("agent SIGKILLed mid-task finishes elsewhere", func(t *testing.T) {
		r := w.start(t, "run", "--retries", "2", "--", "sh", "-c", "echo begin; sleep 4; echo end")
		controlplanetest.Eventually(t, 60*time.Second, "task started", func() bool {
			so, _ := r.out()
			return strings.Contains(so, "begin")
		})
		ts := w.tasks(t)
		victim := ts[0].Attempts[len(ts[0].Attempts)-1].MachineID
		w.kill(t, victim)
		code := r.wait(t, 120*time.Second)
		so, se := r.out()
		if code != 0 || !strings.Contains(so, "end\n") || !strings.Contains(se, "attempt 2") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		ts = w.tasks(t)
		if n := len(ts[0].Attempts); n != 2 || ts[0].Attempts[0].State != "ATTEMPT_STATE_LOST" || ts[0].Attempts[1].MachineID == victim {
			t.Fatalf("attempts: %+v", ts[0].Attempts)
		}
		// The victim's agent starts again: it removes what the killed one
		// left (the container's rootfs mount, state) and comes back.
		w.startAgent(t, w.runs[victim])
		controlplanetest.Eventually(t, 60*time.Second, "the restarted agent online", func() bool {
			for _, m := range w.machines(t) {
				if m.ID == victim {
					return m.State == "MACHINE_STATE_ONLINE"
				}
			}
			return false
		})
		// It also finishes the attempt it found and detaches that
		// attempt's network: no namespace of the machine's is left. (This
		// subtest's end stops the agent, and every child in its process
		// group, mid-cleanup otherwise.)
		prefix := agent.NodeConfig{MachineID: victim}.WithDefaults().Prefix
		controlplanetest.Eventually(t, 60*time.Second, "the lost attempt's network namespace removed", func() bool {
			ents, _ := os.ReadDir("/run/netns")
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), prefix+"-") {
					return false
				}
			}
			return true
		})
	})

	t.Run("controlplane restart mid-task loses nothing", func(t *testing.T) {
		r := w.start(t, "run", "--", "sh", "-c", "for i in 1 2 3 4 5 6 7 8; do echo line$i; sleep 1; done")
		controlplanetest.Eventually(t, 60*time.Second, "task started", func() bool {
			so, _ := r.out()
			return strings.Contains(so, "line2")
		})
		w.in.Server.Stop()
		w.in = controlplanetest.Start(t, w.in.Config, true)
		code := r.wait(t, 120*time.Second)
		so, se := r.out()
		want := "line1\nline2\nline3\nline4\nline5\nline6\nline7\nline8\n"
		if code != 0 || so != want {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
	})
}

// kill SIGKILLs a machine's agent (no goodbye on its tunnel).
func (w *taskWorld) kill(t *testing.T, machineID string) {
	t.Helper()
	if err := syscall.Kill(agentPID(t, machineID), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// agentPID finds the process running 'levers9-agent run' whose state
// directory belongs to machineID.
func agentPID(t *testing.T, machineID string) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), "levers9-agent\x00run\x00") {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i, a := range args {
			if a != "--state-dir" || i+1 >= len(args) {
				continue
			}
			id, _ := os.ReadFile(filepath.Join(args[i+1], "machine-id"))
			if strings.TrimSpace(string(id)) == machineID {
				return pid
			}
		}
	}
	t.Fatalf("no agent process for %s", machineID)
	return 0
}
