package api

import (
	"context"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/internal/errdefs"
)

// PoolService implements levers9.v1.PoolService.
type PoolService struct {
	v1.UnimplementedPoolServiceServer
	*Deps
}

// ListPools lists the configured pools with the caller's machines in them.
func (s *PoolService) ListPools(ctx context.Context, _ *v1.ListPoolsRequest) (*v1.ListPoolsResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	machines, err := s.Store.ListMachines(ctx, p.WorkspaceID, "")
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	resp := &v1.ListPoolsResponse{}
	byName := map[string]*v1.Pool{}
	for _, name := range s.Config.Worker.PoolNames() {
		cfg := s.Config.Worker.Pools[name]
		pool := &v1.Pool{Name: name, GpuType: cfg.GPUType, NodeSelector: cfg.NodeSelector, Security: tasks.SecuritySettings(s.Config, name)}
		byName[name] = pool
		resp.Pools = append(resp.Pools, pool)
	}
	for _, m := range machines {
		pool, ok := byName[m.Pool]
		if !ok {
			continue
		}
		pool.Machines++
		if pb := s.machinePB(m); pb.State == v1.MachineState_MACHINE_STATE_ONLINE {
			pool.MachinesOnline++
			gpus := int32(len(pb.GetInventory().GetGpus()))
			pool.GpusTotal += gpus
			// Free GPUs are total minus those held by running tasks; tasks
			// come with the scheduler, so all are free until then.
			pool.GpusFree += gpus
		}
	}
	return resp, nil
}
