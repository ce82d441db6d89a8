package tasks_test

import (
	"testing"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// poolOf returns the named pool of `pool list` (ListPools).
func poolOf(t *testing.T, b *bundle, name string) *v1.Pool {
	t.Helper()
	resp, err := v1.NewPoolServiceClient(b.in.Conn).ListPools(b.ctx, &v1.ListPoolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.Pools {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no pool %q in %v", name, resp.Pools)
	return nil
}

// TestPoolListCountsHeldGPUs: a running task that holds one of a
// machine's two GPUs leaves one free in `pool list`, and the GPU is free
// again once the task ends.
func TestPoolListCountsHeldGPUs(t *testing.T) {
	t.Parallel()
	cfg := config1s(t)
	cfg.Worker.Pools["gpu"] = config.Pool{Runtime: "runc", GPUType: "l40s"}
	b := start(t, cfg)
	controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "gpu", 4, 2)
	if p := poolOf(t, b, "gpu"); p.GpusFree != 2 || p.GpusTotal != 2 {
		t.Fatalf("idle pool: %d/%d GPUs free, want 2/2", p.GpusFree, p.GpusTotal)
	}
	task := b.submit(t, &v1.TaskSpec{Pool: "gpu", Gpus: 1, Command: []string{"sleep"}}, "gpu-1")
	waitState(t, b, task.Id, v1.TaskState_TASK_STATE_RUNNING)
	if p := poolOf(t, b, "gpu"); p.GpusFree != 1 || p.GpusTotal != 2 {
		t.Errorf("one GPU held: %d/%d GPUs free, want 1/2", p.GpusFree, p.GpusTotal)
	}
	if p := poolOf(t, b, "default"); p.GpusFree != 0 || p.GpusTotal != 0 {
		t.Errorf("pool default: %d/%d GPUs", p.GpusFree, p.GpusTotal)
	}
	if _, err := b.tasks.CancelTask(b.ctx, &v1.CancelTaskRequest{Id: task.Id}); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, task.Id, v1.TaskState_TASK_STATE_CANCELLED)
	controlplanetest.Eventually(t, 10*time.Second, "the GPU free again", func() bool {
		p := poolOf(t, b, "gpu")
		return p.GpusFree == 2
	})
}

// TestVolumeMountValidationIsPushed: worker.volumeMountValidation and a
// pool's override reach the agent in the pushed attempt's security
// settings, and `pool list` shows them.
func TestVolumeMountValidationIsPushed(t *testing.T) {
	t.Parallel()
	cfg := config1s(t)
	cfg.Worker.VolumeMountValidation = "log"
	cfg.Worker.Pools["strict"] = config.Pool{Runtime: "runc", VolumeMountValidation: "enforce"}
	b := start(t, cfg)
	loose := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	strict := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "strict", 2, 0)
	for pool, want := range map[string]string{"default": "log", "strict": "enforce"} {
		if got := poolOf(t, b, pool).GetSecurity().GetVolumeMountValidation(); got != want {
			t.Errorf("pool list %s: volume mount validation %q, want %q", pool, got, want)
		}
		task := b.submit(t, &v1.TaskSpec{Pool: pool, Command: []string{"echo", "hi"}}, "k-"+pool)
		waitState(t, b, task.Id, v1.TaskState_TASK_STATE_SUCCEEDED)
	}
	for m, want := range map[*controlplanetest.ScriptedMachine]string{loose: "log", strict: "enforce"} {
		got := m.Attempts()
		if len(got) != 1 || got[0].GetSecurity().GetVolumeMountValidation() != want {
			t.Errorf("machine %s got attempts %v, want one with volume mount validation %q", m.ID, got, want)
		}
	}
}
