package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/agent/taskrun"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/imagetest"
	"github.com/levers9/levers9/tunnel"
)

// startOrder is a prestart hook that records, as each new attempt is about
// to create its container, whether the stale container (the process
// carrying marker) still runs.
type startOrder struct {
	marker string
	// mu guards starts.
	mu     sync.Mutex
	starts []string
}

func (o *startOrder) Name() string { return "start-order" }

func (o *startOrder) Prestart(_ context.Context, req *taskrun.PrestartRequest, _ *taskrun.PrestartResponse) error {
	stale := "stale container gone"
	if markedProcessRuns(o.marker) {
		stale = "stale container STILL RUNNING"
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.starts = append(o.starts, fmt.Sprintf("start %s.%d: %s", req.Task.ID, req.Task.Attempt, stale))
	return nil
}

func (o *startOrder) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.starts...)
}

// markedProcessRuns reports whether a `sh -c SCRIPT` process whose script
// holds marker runs on this host.
func markedProcessRuns(marker string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) >= 3 && args[1] == "-c" && strings.Contains(args[2], marker) {
			return true
		}
	}
	return false
}

// TestAgentBackAfterTheGraceKillsStaleContainersFirst is the attack: an
// agent is away (stopped, its container left running) longer than the
// controlplane's lostAgentGrace, so the controlplane gives the attempt up
// and places the retry on the same machine. The agent comes back, resumes
// the old attempt, and the controlplane pushes the retry as soon as the
// tunnel is up, racing the heartbeat whose stop list names the old one.
// The old container must be dead before the retry's container is created:
// one attempt of a task at a time on a machine.
func TestAgentBackAfterTheGraceKillsStaleContainersFirst(t *testing.T) {
	t.Parallel()
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rb := make([]byte, 2)
	_, _ = rand.Read(rb)
	prefix := "l9g" + hex.EncodeToString(rb)

	reg := imagetest.StartRegistry(t, imagetest.RegistryOptions{})
	img, err := build.BuildBusybox(ctx, reg.Host, "l9g/busybox", "test", nil, build.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := setupJoinWith(t, func(c *config.Config) {
		c.Worker.DefaultImage = img.Ref
		c.Controlplane.LostAgentGrace = "2s"
		c.WithDefaults()
	})
	in, admin := b.in, b.ctx
	machines, tasksAPI := v1.NewMachineServiceClient(in.Conn), v1.NewTaskServiceClient(in.Conn)
	created, err := machines.CreateMachine(admin, &v1.CreateMachineRequest{Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(created.JoinToken), 0o600)
	state := State{Dir: filepath.Join(dir, "state")}
	if _, err := Join(ctx, JoinOptions{Controlplane: in.Server.GRPCAddr(), CAFile: b.caFile, TokenFile: tokenFile, State: state, Version: "t"}); err != nil {
		t.Fatal(err)
	}
	marker := "stale-" + prefix
	order := &startOrder{marker: marker}
	node := testNode{prefix: prefix, sbState: filepath.Join("/run", prefix+"-test"), imageRoot: filepath.Join(t.TempDir(), "images"),
		registry: reg.Host, state: state, hooks: func(taskrun.Task) []taskrun.Hook { return []taskrun.Hook{order} }}
	logger := slog.New(slog.NewTextHandler(testenv.LogWriter(t, "AGENT_TEST_LOGS"), &slog.HandlerOptions{Level: slog.LevelDebug}))
	var runner *taskrun.Runner
	start := func() *Agent {
		t.Helper()
		runner = newTestRunner(t, node, logger)
		return startedAgent(t, RunOptions{State: state, Version: "t", Log: logger, HeartbeatInterval: 200 * time.Millisecond,
			Client: tunnel.ClientConfig{BackoffBase: 100 * time.Millisecond, BackoffMax: 500 * time.Millisecond}, Runner: runner})
	}
	getTask := func(id string) *v1.Task {
		got, err := tasksAPI.GetTask(admin, &v1.GetTaskRequest{Id: id})
		if err != nil {
			return nil
		}
		return got.Task
	}

	a := start()
	sub, err := tasksAPI.SubmitTask(admin, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Retries: 3,
		Command: []string{"/bin/sh", "-c", "echo " + marker + "; sleep 60; echo done"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := sub.Task.Id
	controlplanetest.Eventually(t, 60*time.Second, "attempt 1 running", func() bool {
		task := getTask(id)
		if task != nil && task.State != v1.TaskState_TASK_STATE_RUNNING && task.State != v1.TaskState_TASK_STATE_PENDING &&
			task.State != v1.TaskState_TASK_STATE_SCHEDULED {
			t.Fatalf("task %s: %v %q %v", id, task.State, task.Message, task.Attempts)
		}
		return task != nil && task.State == v1.TaskState_TASK_STATE_RUNNING && markedProcessRuns(marker)
	})

	// Away: the agent stops, its container keeps running, and the
	// controlplane gives attempt 1 up after the grace.
	a.Stop()
	controlplanetest.Eventually(t, 30*time.Second, "attempt 1 given up by the controlplane", func() bool {
		task := getTask(id)
		return task != nil && len(task.Attempts) > 0 && task.Attempts[0].State == v1.AttemptState_ATTEMPT_STATE_LOST
	})
	if !markedProcessRuns(marker) {
		t.Fatal("the detached container of attempt 1 died while its agent was away")
	}

	// Back: attempt 2 comes to this machine.
	a = start()
	// (A retry the controlplane gave up too, pushed while the agent was
	// still away, makes the next one; the rule is the same for each.)
	controlplanetest.Eventually(t, 60*time.Second, "a retry started on the machine", func() bool { return len(order.list()) > 1 })
	for _, got := range order.list()[1:] {
		if !strings.HasSuffix(got, ": stale container gone") {
			t.Errorf("order on the machine's return: %q; want attempt 1's container killed before a retry's is created", order.list())
		}
	}
	// (A kill while the container is STARTING waits for the container to
	// end: cancel once it runs.)
	controlplanetest.Eventually(t, 60*time.Second, "the retry running", func() bool {
		task := getTask(id)
		return task != nil && len(task.Attempts) > 1 && task.Attempts[len(task.Attempts)-1].State == v1.AttemptState_ATTEMPT_STATE_RUNNING
	})
	if _, err := tasksAPI.CancelTask(admin, &v1.CancelTaskRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	controlplanetest.Eventually(t, 30*time.Second, "the task cancelled", func() bool {
		task := getTask(id)
		return task != nil && task.State == v1.TaskState_TASK_STATE_CANCELLED
	})
	a.Stop()
	controlplanetest.Eventually(t, 30*time.Second, "no container left", func() bool { return !markedProcessRuns(marker) })
	if lost, err := runner.Reconcile(ctx); err != nil || len(lost) != 0 {
		t.Errorf("reconcile: %v, leftovers %+v", err, lost)
	}
}
