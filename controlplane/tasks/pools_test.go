package tasks_test

import (
	"strings"
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

// TestKubernetesPoolShapeAtSubmit: a pool with provider kubernetes may have
// no worker at all, so submit judges a task by the pool's worker shape:
// what fits is queued, what no worker pod could take is refused at once,
// and a GPU task is refused with "not enough GPUs available" when worker
// pods may not request GPUs (worker.jobResourcesEnforced false).
func TestKubernetesPoolShapeAtSubmit(t *testing.T) {
	t.Parallel()
	kpool := func(gpus int) config.Pool {
		return config.Pool{Runtime: "runc", Provider: config.ProviderKubernetes, MaxWorkers: 1, IdleTimeout: "1m",
			Shape: config.WorkerShape{CPU: "2", Memory: "1Gi", GPUs: gpus}}
	}
	listed := func(p config.Pool, ws ...string) config.Pool { p.Workspaces = ws; return p }
	tests := []struct {
		name     string
		enforced bool
		pool     config.Pool
		spec     *v1.TaskSpec
		wantErr  string
	}{
		{name: "fits", enforced: true, pool: kpool(2), spec: &v1.TaskSpec{CpuMillis: 2000, MemoryBytes: 1 << 30, Gpus: 2}},
		{name: "too much CPU", enforced: true, pool: kpool(2), spec: &v1.TaskSpec{CpuMillis: 2500}, wantErr: "more than one worker pod may take: 2500 mCPU"},
		{name: "too many GPUs", enforced: true, pool: kpool(2), spec: &v1.TaskSpec{Gpus: 3}, wantErr: "3 GPUs (shape.gpus 2)"},
		{name: "no GPUs in the shape", enforced: true, pool: kpool(0), spec: &v1.TaskSpec{Gpus: 1}, wantErr: "not enough GPUs available"},
		{name: "GPU requests not enforced", enforced: false, pool: kpool(2), spec: &v1.TaskSpec{Gpus: 1}, wantErr: "not enough GPUs available: worker.jobResourcesEnforced is false"},
		{name: "workspace not listed", enforced: true, pool: listed(kpool(0), "someone-else"), spec: &v1.TaskSpec{CpuMillis: 100}, wantErr: `pool "k" is not shared with this workspace`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := config1s(t)
			cfg.Worker.JobResourcesEnforced = &tt.enforced
			cfg.Worker.Pools["k"] = tt.pool
			b := start(t, cfg)
			tt.spec.Pool, tt.spec.Command = "k", []string{"true"}
			_, err := b.tasks.SubmitTask(b.ctx, &v1.SubmitTaskRequest{Spec: tt.spec})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
