package tasks_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// startedTasks is the set of task IDs a machine started.
func startedTasks(m *controlplanetest.ScriptedMachine) map[string]bool {
	out := map[string]bool{}
	for _, k := range m.Started() {
		out[strings.Split(k, "/")[0]] = true
	}
	return out
}

// The attack: workspace B enrolls a machine in the pool A uses and has it
// claim 1000 CPUs. A's tasks must still run only on A's machine, waiting
// for it when it is busy, and A's submit-time fit check must not count B's
// machine.
func TestMachinesServeOnlyTheirWorkspace(t *testing.T) {
	t.Parallel()
	a := start(t, config1s(t))
	b := secondWorkspace(t, a)
	mineA := controlplanetest.StartScriptedMachine(t, a.in, a.ctx, "default", 1, 0)
	mineB := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 1000, 0)

	// B's huge machine does not make a task too big for A's machines fit.
	_, err := a.tasks.SubmitTask(a.ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: []string{"echo"}, CpuMillis: 64000}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "no machine has CPU and memory") {
		t.Errorf("a 64-CPU task of A with only A's 1-CPU machine its own: %v", err)
	}

	first := a.submit(t, &v1.TaskSpec{Command: []string{"sleep"}, CpuMillis: 1000}, "")
	waitState(t, a, first.Id, v1.TaskState_TASK_STATE_RUNNING)
	second := a.submit(t, &v1.TaskSpec{Command: []string{"sleep", "100ms"}, CpuMillis: 1000}, "")
	holds(t, 1500*time.Millisecond, "A's second task waits for A's busy machine rather than going to B's", func() bool {
		r, err := a.tasks.GetTask(a.ctx, &v1.GetTaskRequest{Id: second.Id})
		return err == nil && r.Task.State == v1.TaskState_TASK_STATE_PENDING && len(mineB.Started()) == 0
	})
	// B's own tasks run on B's machine, never on A's (which is full anyway,
	// so give it room first).
	if _, err := a.tasks.CancelTask(a.ctx, &v1.CancelTaskRequest{Id: first.Id}); err != nil {
		t.Fatal(err)
	}
	done := waitState(t, a, second.Id, v1.TaskState_TASK_STATE_SUCCEEDED)
	if done.Attempts[0].MachineId != mineA.ID {
		t.Errorf("A's task ran on %s, not on A's machine %s", done.Attempts[0].MachineId, mineA.ID)
	}
	var theirs []string
	for range 3 {
		theirs = append(theirs, b.submit(t, &v1.TaskSpec{Command: []string{"echo", "b"}}, "").Id)
	}
	var ours []string
	for range 3 {
		ours = append(ours, a.submit(t, &v1.TaskSpec{Command: []string{"echo", "a"}, CpuMillis: 300}, "").Id)
	}
	for _, id := range theirs {
		waitState(t, b, id, v1.TaskState_TASK_STATE_SUCCEEDED)
	}
	for _, id := range ours {
		waitState(t, a, id, v1.TaskState_TASK_STATE_SUCCEEDED)
	}
	onA, onB := startedTasks(mineA), startedTasks(mineB)
	for _, id := range append([]string{first.Id, second.Id}, ours...) {
		if !onA[id] || onB[id] {
			t.Errorf("A's task %s: on A's machine %v, on B's %v", id, onA[id], onB[id])
		}
	}
	for _, id := range theirs {
		if onA[id] || !onB[id] {
			t.Errorf("B's task %s: on A's machine %v, on B's %v", id, onA[id], onB[id])
		}
	}
}

// A workspace with no machine of its own in a pool that is not shared gets
// what an empty pool gives: CPU tasks are accepted and wait, and the
// PENDING event says why.
func TestNoMachineOfOwnWaits(t *testing.T) {
	t.Parallel()
	a := start(t, config1s(t))
	b := secondWorkspace(t, a)
	controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 8, 0)
	task := a.submit(t, &v1.TaskSpec{Command: []string{"echo", "x"}}, "")
	holds(t, 1500*time.Millisecond, "A's task waits for a machine of A's", func() bool {
		r, err := a.tasks.GetTask(a.ctx, &v1.GetTaskRequest{Id: task.Id})
		return err == nil && r.Task.State == v1.TaskState_TASK_STATE_PENDING
	})
	evs := follow(t, a, task.Id, "", 1)
	if msg := evs[0].GetState().GetMessage(); !strings.Contains(msg, "no machine of this workspace") {
		t.Errorf("PENDING message %q does not say why nothing fits", msg)
	}
}

// A pool the operator declares shared serves every workspace; one limited
// with workspaces serves only those (named by ID or name) besides the
// machine's own.
func TestSharedPoolsServeEveryWorkspace(t *testing.T) {
	t.Parallel()
	cfg := config1s(t)
	cfg.Worker.Pools["ops"] = config.Pool{Runtime: "runc", Shared: true}
	cfg.Worker.Pools["team"] = config.Pool{Runtime: "runc", Shared: true, Workspaces: []string{"second"}}
	a := start(t, cfg)
	b := secondWorkspace(t, a)
	c := workspaceNamed(t, a, "third")
	ops := controlplanetest.StartScriptedMachine(t, a.in, a.ctx, "ops", 4, 0)
	team := controlplanetest.StartScriptedMachine(t, a.in, a.ctx, "team", 4, 0)

	for _, w := range []*bundle{a, b, c} {
		id := w.submit(t, &v1.TaskSpec{Pool: "ops", Command: []string{"echo", "shared"}}, "").Id
		if done := waitState(t, w, id, v1.TaskState_TASK_STATE_SUCCEEDED); done.Attempts[0].MachineId != ops.ID {
			t.Errorf("task in the shared pool ran on %s", done.Attempts[0].MachineId)
		}
	}
	for _, w := range []*bundle{a, b} {
		id := w.submit(t, &v1.TaskSpec{Pool: "team", Command: []string{"echo", "team"}}, "").Id
		waitState(t, w, id, v1.TaskState_TASK_STATE_SUCCEEDED)
	}
	outsider := c.submit(t, &v1.TaskSpec{Pool: "team", Command: []string{"echo", "no"}}, "")
	holds(t, 1500*time.Millisecond, "a workspace not in worker.pools.team.workspaces waits", func() bool {
		r, err := c.tasks.GetTask(c.ctx, &v1.GetTaskRequest{Id: outsider.Id})
		return err == nil && r.Task.State == v1.TaskState_TASK_STATE_PENDING && !startedTasks(team)[outsider.Id]
	})

	// pool list counts shared machines for everyone, and says so.
	for _, w := range []*bundle{b, c} {
		r, err := v1.NewPoolServiceClient(w.in.Conn).ListPools(w.ctx, &v1.ListPoolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]*v1.Pool{}
		for _, p := range r.Pools {
			got[p.Name] = p
		}
		wantTeam := int32(0)
		if w == b {
			wantTeam = 1
		}
		if p := got["ops"]; p.Machines != 1 || p.MachinesOnline != 1 || !p.Shared {
			t.Errorf("ops as seen by another workspace: %v", p)
		}
		if p := got["team"]; p.Machines != wantTeam || !p.Shared {
			t.Errorf("team as seen by another workspace: %v, want %d machines", p, wantTeam)
		}
		if p := got["default"]; p.Machines != 0 || p.Shared {
			t.Errorf("default as seen by another workspace: %v", p)
		}
	}
}
