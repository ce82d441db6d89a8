package tasks_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/enroll"
)

// An attached cluster's agent (scripted at the tunnel boundary, recording
// the workers it is asked for):
//
//   - takes no task itself, however much its cluster has; with two
//     clusters in the pool, one worker is made per task, not two;
//   - a task bigger than the cluster's largest node is refused at submit;
//   - a task of its pool makes one worker through it (MakeWorker over its
//     tunnel) sized for the task, with a single-use token, whose machine
//     is labelled as the agent's worker; the worker that joins with that
//     token runs the task with the worker-wide security, not the pool's
//     override;
//   - the agent may report only its own workers gone, and its report loses
//     the attempt at once;
//   - deleting the agent has it remove its workers first.
func TestAttachedClusterWorkers(t *testing.T) {
	t.Parallel()
	cfg := config1s(t)
	cfg.Controlplane.LostAgentGrace = "1m" // a lost attempt must come from the report
	no := false
	p := cfg.Worker.Pools["default"]
	p.Security.DropNetRaw = &no // the pool's override, which the cluster's workers do not take
	cfg.Worker.Pools["default"] = p
	a := start(t, cfg)
	machines := v1.NewMachineServiceClient(a.in.Conn)
	// Two clusters attached to the same pool by the same workspace: one
	// makes the workers, or both would make one for the same task.
	ca1 := controlplanetest.StartScriptedClusterAgent(t, a.in, a.ctx, "default", 8)
	ca2 := controlplanetest.StartScriptedClusterAgent(t, a.in, a.ctx, "default", 8)
	workers := func() map[string]*agentv1.MakeWorkerRequest {
		all := ca1.Workers()
		for k, v := range ca2.Workers() {
			all[k] = v
		}
		return all
	}

	_, err := a.tasks.SubmitTask(a.ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: []string{"echo"}, CpuMillis: 16000}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "bigger than any node") {
		t.Errorf("a 16-CPU task on an 8-CPU node's cluster: %v", err)
	}

	task := a.submit(t, &v1.TaskSpec{Command: []string{"sleep"}, CpuMillis: 1500, Retries: 1}, "")
	controlplanetest.Eventually(t, 10*time.Second, "a worker asked of a cluster agent", func() bool { return len(workers()) == 1 })
	holds(t, 1500*time.Millisecond, "the task waits for its one worker, never on an agent", func() bool {
		r, err := a.tasks.GetTask(a.ctx, &v1.GetTaskRequest{Id: task.Id})
		return err == nil && r.Task.State == v1.TaskState_TASK_STATE_PENDING && len(ca1.Started())+len(ca2.Started()) == 0 && len(workers()) == 1
	})
	ca, other := ca1, ca2
	if len(ca2.Workers()) == 1 {
		ca, other = ca2, ca1
	}
	var req *agentv1.MakeWorkerRequest
	for _, r := range ca.Workers() {
		req = r
	}
	if s := req.GetSpec(); s.GetPool() != "default" || s.GetCpuMillis() != 1500 || req.GetJoinToken() == "" {
		t.Fatalf("MakeWorker spec %v (token set: %v), want pool default, 1500m", s, req.GetJoinToken() != "")
	}
	wm, err := machines.GetMachine(a.ctx, &v1.GetMachineRequest{Id: req.GetSpec().GetMachineId()})
	if err != nil || wm.Machine.Labels[enroll.ClusterWorkerLabel] != ca.ID {
		t.Fatalf("the worker's machine: %v %v, want labelled %s=%s", err, wm.GetMachine().GetLabels(), enroll.ClusterWorkerLabel, ca.ID)
	}

	worker := controlplanetest.StartScriptedWorker(t, a.in, a.ctx, req.GetJoinToken(), 2)
	if worker.ID != req.GetSpec().GetMachineId() {
		t.Fatalf("the worker enrolled as %s, want %s", worker.ID, req.GetSpec().GetMachineId())
	}
	waitState(t, a, task.Id, v1.TaskState_TASK_STATE_RUNNING)
	if at := worker.Attempts(); len(at) != 1 || !at[0].GetSecurity().GetDropNetRaw() {
		t.Errorf("the worker's attempt security %v, want the worker-wide dropNetRaw true", at)
	}
	if len(ca1.Started())+len(ca2.Started()) != 0 {
		t.Errorf("the cluster agents started %v %v", ca1.Started(), ca2.Started())
	}

	// Only its own workers: the other cluster's agent may not give up
	// this one's worker, nor anyone a machine that is no worker.
	if _, err := other.Controlplane().WorkerGone(a.ctx, &agentv1.WorkerGoneRequest{MachineId: worker.ID, Why: "made up"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("WorkerGone of another agent's worker: %v, want PermissionDenied", err)
	}
	plain := controlplanetest.StartScriptedMachine(t, a.in, a.ctx, "default", 1, 0)
	if _, err := ca.Controlplane().WorkerGone(a.ctx, &agentv1.WorkerGoneRequest{MachineId: plain.ID, Why: "made up"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("WorkerGone of a machine not its worker: %v, want PermissionDenied", err)
	}
	reported := time.Now()
	if _, err := ca.Controlplane().WorkerGone(a.ctx, &agentv1.WorkerGoneRequest{Pod: "worker-pod", MachineId: worker.ID, Why: "pod worker-pod was deleted"}); err != nil {
		t.Fatalf("WorkerGone of its worker: %v", err)
	}
	got := waitState(t, a, task.Id, v1.TaskState_TASK_STATE_PENDING)
	// Attempt 2 waits for a new worker: the scripted worker still holds
	// its tunnel (as a pod in its grace period does), yet gets nothing more.
	holds(t, time.Second, "the retry waits for a new worker", func() bool {
		r, err := a.tasks.GetTask(a.ctx, &v1.GetTaskRequest{Id: task.Id})
		return err == nil && r.Task.State == v1.TaskState_TASK_STATE_PENDING && len(worker.Started()) == 1
	})
	if len(got.Attempts) != 1 || got.Attempts[0].State != v1.AttemptState_ATTEMPT_STATE_LOST || !strings.Contains(got.Attempts[0].Message, "worker-pod") {
		t.Errorf("after the report (%s): attempts %v", time.Since(reported).Round(time.Millisecond), got.Attempts)
	}

	resp, err := machines.DeleteMachine(a.ctx, &v1.DeleteMachineRequest{Id: ca.ID})
	if err != nil || resp.ClusterAgentOffline {
		t.Fatalf("deleting the cluster agent: %v %v", err, resp)
	}
	if n := len(ca.Workers()); n != 0 {
		t.Errorf("%d workers left after the agent was deleted (it removed %d)", n, resp.ClusterWorkersRemoved)
	}
}
