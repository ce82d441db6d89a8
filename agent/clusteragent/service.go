package clusteragent

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// service is the ClusterAgent push service: worker Jobs of one pool in
// one namespace, through the agent's own service account.
type service struct {
	agentv1.UnimplementedClusterAgentServer
	jobs *kubeworkers.Client
	pool string
	// image, controlplane and caFile are what this agent joined with; they
	// replace what the controlplane sends (its worker image and the
	// address its own Kubernetes pools' workers dial, which may not be
	// reachable from this cluster), since this agent reached it with them.
	image, controlplane, caFile string
	// nodeSelector and podAnnotations are added to every worker pod's.
	nodeSelector, podAnnotations map[string]string
	log                          *slog.Logger
}

func (s *service) MakeWorker(ctx context.Context, req *agentv1.MakeWorkerRequest) (*agentv1.MakeWorkerResponse, error) {
	ps := req.GetSpec()
	if ps.GetPool() != s.pool {
		return nil, errdefs.ToGRPC(fmt.Errorf("this cluster agent makes workers of pool %s only, not %q: %w", s.pool, ps.GetPool(), errdefs.ErrPermissionDenied))
	}
	if ps.GetMachineId() == "" || req.GetJoinToken() == "" {
		return nil, errdefs.ToGRPC(fmt.Errorf("a worker needs its machine id and join token: %w", errdefs.ErrInvalidArgument))
	}
	spec := kubeworkers.Spec{Pool: ps.Pool, MachineID: ps.MachineId, Image: ps.Image, Controlplane: ps.Controlplane,
		CPUMillis: ps.CpuMillis, MemoryBytes: ps.MemoryBytes, GPUs: int(ps.Gpus), Enforced: ps.Enforced,
		NodeSelector: ps.NodeSelector, RuntimeClassName: ps.RuntimeClassName, IdleTimeout: ps.GetIdleTimeout().AsDuration(),
		PodAnnotations: ps.PodAnnotations, AgentArgs: ps.AgentArgs, ImagePullSecrets: ps.ImagePullSecrets}
	for _, t := range ps.Tolerations {
		spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOperator(t.Operator),
			Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
	}
	if s.image != "" {
		spec.Image = s.image
	}
	spec.NodeSelector = merged(spec.NodeSelector, s.nodeSelector)
	spec.PodAnnotations = merged(spec.PodAnnotations, s.podAnnotations)
	if s.controlplane != "" {
		spec.Controlplane = s.controlplane
	}
	ca := req.GetCaPem()
	if s.caFile != "" {
		b, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, errdefs.ToGRPC(fmt.Errorf("reading the controlplane CA %s for worker %s: %w", s.caFile, ps.MachineId, err))
		}
		ca = b
	}
	if spec.Image == "" || spec.Controlplane == "" {
		return nil, errdefs.ToGRPC(fmt.Errorf("worker %s: no worker image or controlplane address (neither sent nor set on this agent): %w", ps.MachineId, errdefs.ErrInvalidArgument))
	}
	job, err := s.jobs.Create(ctx, spec, req.GetJoinToken(), ca)
	if err != nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable))
	}
	s.log.Info("worker Job created", "pool", spec.Pool, "job", job.Name, "machine_id", spec.MachineID,
		"cpu_millis", spec.CPUMillis, "memory_bytes", spec.MemoryBytes, "gpus", spec.GPUs)
	return &agentv1.MakeWorkerResponse{Name: job.Name}, nil
}

func (s *service) RemoveWorker(ctx context.Context, req *agentv1.RemoveWorkerRequest) (*agentv1.RemoveWorkerResponse, error) {
	if req.GetName() == "" {
		return nil, errdefs.ToGRPC(fmt.Errorf("RemoveWorker needs a Job name: %w", errdefs.ErrInvalidArgument))
	}
	// Only this pool's workers: a name of anything else is not ours.
	workers, err := s.jobs.List(ctx, s.pool)
	if err != nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable))
	}
	for _, w := range workers {
		if w.Name == req.GetName() {
			if err := s.jobs.Delete(ctx, w.Name); err != nil {
				return nil, errdefs.ToGRPC(fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable))
			}
			s.log.Info("worker Job removed", "pool", s.pool, "job", w.Name, "machine_id", w.MachineID)
			return &agentv1.RemoveWorkerResponse{}, nil
		}
	}
	return &agentv1.RemoveWorkerResponse{}, nil // already gone
}

func (s *service) ListWorkers(ctx context.Context, req *agentv1.ListWorkersRequest) (*agentv1.ListWorkersResponse, error) {
	if req.GetPool() != "" && req.GetPool() != s.pool {
		return &agentv1.ListWorkersResponse{}, nil
	}
	workers, err := s.jobs.List(ctx, s.pool)
	if err != nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable))
	}
	resp := &agentv1.ListWorkersResponse{}
	for _, w := range workers {
		pb := &agentv1.Worker{Name: w.Name, Pool: w.Pool, MachineId: w.MachineID, State: string(w.State),
			CpuMillis: w.CPUMillis, MemoryBytes: w.MemoryBytes, Gpus: int32(w.GPUs)}
		if !w.Started.IsZero() {
			pb.Started = timestamppb.New(w.Started)
		}
		resp.Workers = append(resp.Workers, pb)
	}
	return resp, nil
}

// merged is a with b's keys set over it (nil when both are empty).
func merged(a, b map[string]string) map[string]string {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make(map[string]string, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
