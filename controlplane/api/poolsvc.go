package api

import (
	"context"
	"strconv"
	"strings"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/internal/errdefs"
)

// PoolService implements levers9.v1.PoolService.
type PoolService struct {
	v1.UnimplementedPoolServiceServer
	*Deps
}

// ListPools lists the configured pools with the machines in them that may
// serve the caller: its own, and in a pool shared with it
// (worker.pools.NAME.shared and .workspaces) the enrolled machines of
// other workspaces too.
func (s *PoolService) ListPools(ctx context.Context, _ *v1.ListPoolsRequest) (*v1.ListPoolsResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	machines, err := s.Store.ListMachines(ctx, p.WorkspaceID, "")
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	wsName := "" // read once, if a pool's workspaces list needs it
	resp := &v1.ListPoolsResponse{}
	byName := map[string]*v1.Pool{}
	// GPUs held by active attempts, per machine of each pool: free GPUs
	// are the online machines' GPUs less these.
	held := map[string]int32{}
	for _, name := range s.Config.Worker.PoolNames() {
		cfg := s.Config.Worker.Pools[name]
		pool := &v1.Pool{Name: name, GpuType: cfg.GPUType, NodeSelector: cfg.NodeSelector, Security: tasks.SecuritySettings(s.Config, name),
			Shared: cfg.IsShared(), Provider: cfg.Provider}
		if cfg.IsKubernetes() {
			pool.MaxWorkers = int32(cfg.MaxWorkers)
			pool.Workers, pool.Status = s.kubeStatus(ctx, name)
		}
		byName[name] = pool
		resp.Pools = append(resp.Pools, pool)
		inPool, err := s.Store.PoolMachines(ctx, name)
		if err != nil {
			return nil, errdefs.ToGRPC(err)
		}
		for _, pm := range inPool {
			held[pm.ID] = int32(len(pm.UsedGPUs))
		}
		if !cfg.IsShared() {
			continue
		}
		if !cfg.SharedWith(p.WorkspaceID, "") && wsName == "" {
			ws, err := s.Store.GetWorkspace(ctx, p.WorkspaceID)
			if err != nil {
				return nil, errdefs.ToGRPC(err)
			}
			wsName = ws.Name
		}
		if !cfg.SharedWith(p.WorkspaceID, wsName) {
			continue
		}
		for _, pm := range inPool {
			if pm.WorkspaceID == p.WorkspaceID {
				continue // counted with the caller's own below
			}
			var inv v1.Inventory
			if len(pm.Inventory) > 0 {
				_ = protoJSON.Unmarshal(pm.Inventory, &inv)
			}
			_, online := s.Presence.Online(pm.ID)
			countMachine(pool, online, &inv, held[pm.ID])
		}
	}
	for _, m := range machines {
		pool, ok := byName[m.Pool]
		if !ok {
			continue
		}
		pb := s.machinePB(m)
		countMachine(pool, pb.State == v1.MachineState_MACHINE_STATE_ONLINE, pb.GetInventory(), held[m.ID])
	}
	return resp, nil
}

// countMachine adds a machine to its pool's figures; held is how many of
// its GPUs active attempts (scheduled or running) hold.
func countMachine(pool *v1.Pool, online bool, inv *v1.Inventory, held int32) {
	pool.Machines++
	if !online {
		return
	}
	pool.MachinesOnline++
	gpus := int32(len(inv.GetGpus()))
	pool.GpusTotal += gpus
	pool.GpusFree += max(gpus-held, 0)
}

// kubeStatus is what the last reconcile of a Kubernetes pool said: its
// worker Jobs and "waiting for nodes" or "N workers" ("no workers" when no
// replica reconciled it lately).
func (s *PoolService) kubeStatus(ctx context.Context, pool string) (int32, string) {
	v, err := s.Bus.Redis().Get(ctx, bus.KubePoolStatusKey(pool)).Result()
	n, status, ok := strings.Cut(v, "|")
	if err != nil || !ok {
		return 0, "no workers"
	}
	workers, _ := strconv.Atoi(n)
	return int32(workers), status
}
