package tasks

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// WorkerJobs is where a pool's worker Jobs are made: a Kubernetes API the
// controlplane reaches itself (directJobs, provider kubernetes), or an
// attached cluster's agent over its tunnel (remoteJobs), which makes them
// with its own service account so the controlplane holds no credential
// for that cluster. Workers drives both the same way. Every method blocks
// for one or a few calls and is safe for concurrent use.
//
// Pod-gone notifications arrive differently: Workers watches the pods of
// a direct cluster itself (kubeworkers.Watcher), and an attached cluster's
// agent watches its own and calls Controlplane.WorkerGone, which reaches
// Service.WorkerGone.
type WorkerJobs interface {
	// Create makes a worker Job and its join Secret, returning the Job's
	// name. The token goes into the Secret only and never into an error
	// or a log. Not idempotent: one call per worker machine.
	Create(ctx context.Context, spec kubeworkers.Spec, token string, caPEM []byte) (string, error)
	// List is every worker Job of pool, by name.
	List(ctx context.Context, pool string) ([]kubeworkers.Worker, error)
	// Delete removes a worker Job, its pod and its Secret. Idempotent.
	Delete(ctx context.Context, name string) error
}

var (
	_ WorkerJobs = directJobs{}
	_ WorkerJobs = remoteJobs{}
)

// directJobs drives a cluster the controlplane has a client for.
type directJobs struct{ c *kubeworkers.Client }

func (j directJobs) Create(ctx context.Context, spec kubeworkers.Spec, token string, caPEM []byte) (string, error) {
	job, err := j.c.Create(ctx, spec, token, caPEM)
	if err != nil {
		return "", err
	}
	return job.Name, nil
}

func (j directJobs) List(ctx context.Context, pool string) ([]kubeworkers.Worker, error) {
	return j.c.List(ctx, pool)
}

func (j directJobs) Delete(ctx context.Context, name string) error { return j.c.Delete(ctx, name) }

// remoteJobs asks an attached cluster's agent, wherever its tunnel is
// held (a push forwarded to the replica holding it, like RunTask).
type remoteJobs struct {
	d       *deps
	agentID string
}

func (j remoteJobs) client(ctx context.Context) (agentv1.ClusterAgentClient, error) {
	ag, err := j.d.agents()
	if err != nil {
		return nil, err
	}
	c, err := ag.Conn(ctx, j.agentID)
	if err != nil {
		return nil, fmt.Errorf("reaching cluster agent %s: %w", j.agentID, err)
	}
	return agentv1.NewClusterAgentClient(c), nil
}

func (j remoteJobs) Create(ctx context.Context, spec kubeworkers.Spec, token string, caPEM []byte) (string, error) {
	c, err := j.client(ctx)
	if err != nil {
		return "", err
	}
	ws := &agentv1.WorkerSpec{Pool: spec.Pool, MachineId: spec.MachineID, Image: spec.Image, Controlplane: spec.Controlplane,
		CpuMillis: spec.CPUMillis, MemoryBytes: spec.MemoryBytes, Gpus: int32(spec.GPUs), Enforced: spec.Enforced,
		NodeSelector: spec.NodeSelector, RuntimeClassName: spec.RuntimeClassName, IdleTimeout: durationpb.New(spec.IdleTimeout),
		PodAnnotations: spec.PodAnnotations, AgentArgs: spec.AgentArgs, ImagePullSecrets: spec.ImagePullSecrets}
	for _, t := range spec.Tolerations {
		ws.Tolerations = append(ws.Tolerations, &agentv1.Toleration{Key: t.Key, Operator: string(t.Operator), Value: t.Value, Effect: string(t.Effect)})
	}
	resp, err := c.MakeWorker(ctx, &agentv1.MakeWorkerRequest{Spec: ws, JoinToken: token, CaPem: caPEM})
	if err != nil {
		return "", fmt.Errorf("cluster agent %s making worker %s of pool %s: %w", j.agentID, spec.MachineID, spec.Pool, err)
	}
	return resp.Name, nil
}

func (j remoteJobs) List(ctx context.Context, pool string) ([]kubeworkers.Worker, error) {
	c, err := j.client(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := c.ListWorkers(ctx, &agentv1.ListWorkersRequest{Pool: pool})
	if err != nil {
		return nil, fmt.Errorf("cluster agent %s listing the workers of pool %s: %w", j.agentID, pool, err)
	}
	out := make([]kubeworkers.Worker, 0, len(resp.Workers))
	for _, w := range resp.Workers {
		kw := kubeworkers.Worker{Name: w.Name, Pool: w.Pool, MachineID: w.MachineId, State: kubeworkers.State(w.State),
			CPUMillis: w.CpuMillis, MemoryBytes: w.MemoryBytes, GPUs: int(w.Gpus)}
		if w.Started != nil {
			kw.Started = w.Started.AsTime()
		}
		out = append(out, kw)
	}
	return out, nil
}

func (j remoteJobs) Delete(ctx context.Context, name string) error {
	c, err := j.client(ctx)
	if err != nil {
		return err
	}
	if _, err := c.RemoveWorker(ctx, &agentv1.RemoveWorkerRequest{Name: name}); err != nil {
		return fmt.Errorf("cluster agent %s removing worker Job %s: %w", j.agentID, name, err)
	}
	return nil
}
