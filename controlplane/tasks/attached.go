package tasks

import (
	"context"
	"fmt"
	"time"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// Attached clusters: a pool's machines may include the agent of a
// Kubernetes cluster (`levers9 cluster join`, labelled
// enroll.ClusterAgentLabel). The agent runs no task (store.PoolMachines
// leaves it out, so the scheduler never places one there); Workers asks
// it over its tunnel for worker Jobs (remoteJobs), made for the workspace
// that joined the cluster only, with machines labelled
// enroll.ClusterWorkerLabel. Their tasks get the worker-wide security
// (WorkerWideSecurity), not the pool's overrides.

// WorkerGone is an attached cluster's agent (agentID, from its tunnel
// identity) reporting one of its worker pods gone: the worker's attempts
// become LOST at once and its machine is retired. A worker another agent
// made, or no worker at all, is refused (PermissionDenied), so an agent
// can only give up its own workers' attempts.
func (s *Service) WorkerGone(ctx context.Context, agentID string, req *agentv1.WorkerGoneRequest) error {
	m, err := s.Workers.d.store.MachineByID(ctx, req.GetMachineId())
	if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if err != nil || m.Labels[enroll.ClusterWorkerLabel] != agentID {
		return fmt.Errorf("machine %q is not a worker of cluster agent %s: %w", req.GetMachineId(), agentID, errdefs.ErrPermissionDenied)
	}
	s.Workers.podGone(ctx, kubeworkers.PodGone{Pod: req.GetPod(), Pool: m.Pool, MachineID: m.ID, Why: req.GetWhy()})
	return nil
}

// RemoveClusterWorkers asks an attached cluster's agent to remove every
// worker Job it made, and retires their machines, before the agent itself
// is deleted. It returns how many it removed; an agent that is not online
// removes nothing (offline true) and its Jobs end when their agents go
// idle, since their machines are retired here either way.
func (s *Service) RemoveClusterWorkers(ctx context.Context, agent store.Machine) (removed int, offline bool, err error) {
	w := s.Workers
	ag, aerr := w.d.agents()
	if aerr == nil {
		_, on := ag.Online(agent.ID)
		offline = !on
	} else {
		offline = true
	}
	if !offline {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		jobs := remoteJobs{d: w.d, agentID: agent.ID}
		workers, lerr := jobs.List(ctx, "")
		if lerr != nil {
			return 0, false, lerr
		}
		for _, wk := range workers {
			if err := jobs.Delete(ctx, wk.Name); err != nil {
				return removed, false, err
			}
			removed++
		}
	}
	machines, err := w.d.store.ListMachines(ctx, agent.WorkspaceID, agent.Pool)
	if err != nil {
		return removed, offline, err
	}
	for _, m := range machines {
		if m.Labels[enroll.ClusterWorkerLabel] == agent.ID && m.DeletedAt == nil {
			w.retire(ctx, m.ID)
		}
	}
	return removed, offline, nil
}
