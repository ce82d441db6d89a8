package tasks

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
)

// tenancy is which machines of a pool may run one workspace's tasks: the
// machines that workspace enrolled, and every other one only when the
// operator shares the pool with it (worker.pools.NAME.shared and
// .workspaces). Capacity never widens it: a machine of another workspace
// is not a candidate, however much it reports.
type tenancy struct {
	pool        string
	workspaceID string
	shared      bool
}

// serves reports whether a machine enrolled by machineWS may run the
// workspace's tasks.
func (t tenancy) serves(machineWS string) bool { return machineWS == t.workspaceID || t.shared }

// tenancyOf is the tenancy of workspaceID's tasks in pool. The workspace's
// name is read only for a shared pool whose workspaces list does not
// have its ID.
func (d *deps) tenancyOf(ctx context.Context, pool, workspaceID string) (tenancy, error) {
	p := d.config.Worker.Pools[pool]
	t := tenancy{pool: pool, workspaceID: workspaceID, shared: p.SharedWith(workspaceID, "")}
	if p.IsShared() && !t.shared {
		ws, err := d.store.GetWorkspace(ctx, workspaceID)
		if err != nil {
			return t, err
		}
		t.shared = p.SharedWith(workspaceID, ws.Name)
	}
	return t, nil
}

// machineRoom is what a machine has free for one scheduling pass.
type machineRoom struct {
	id string
	// workspace enrolled the machine (see tenancy).
	workspace string
	cpu       int64
	mem       int64
	gpus      []gpuSlot
	cap       store.Capacity
	// clusterWorker: an attached cluster's worker (its tasks get the
	// worker-wide security).
	clusterWorker bool
}

type gpuSlot struct{ id, name string }

type capacity struct {
	cpu, mem int64
	gpus     []gpuSlot
}

func (c capacity) matchingGPUs(kind string) []gpuSlot {
	if kind == "" {
		return c.gpus
	}
	var out []gpuSlot
	for _, g := range c.gpus {
		if strings.Contains(strings.ToLower(g.name), strings.ToLower(kind)) {
			out = append(out, g)
		}
	}
	return out
}

// capacityOf is a machine's total, from its last inventory.
func capacityOf(pm store.PoolMachine) capacity {
	inv := &v1.Inventory{}
	if len(pm.Inventory) > 0 {
		_ = protojson.Unmarshal(pm.Inventory, inv)
	}
	c := capacity{cpu: int64(inv.Cpus) * 1000, mem: int64(inv.MemoryBytes)}
	for _, g := range inv.Gpus {
		id := g.Uuid
		if id == "" {
			id = fmt.Sprint(g.Index)
		}
		c.gpus = append(c.gpus, gpuSlot{id: id, name: g.Name})
	}
	return c
}

// roomOf is what a machine has left after its active attempts.
func roomOf(pm store.PoolMachine) *machineRoom {
	c := capacityOf(pm)
	used := map[string]bool{}
	for _, g := range pm.UsedGPUs {
		used[g] = true
	}
	r := &machineRoom{id: pm.ID, workspace: pm.WorkspaceID, cpu: c.cpu - pm.UsedCPU, mem: c.mem - pm.UsedMem, cap: store.Capacity{CPUMillis: c.cpu, MemoryBytes: c.mem},
		clusterWorker: pm.ClusterWorker}
	for _, g := range c.gpus {
		if !used[g.id] {
			r.gpus = append(r.gpus, g)
		}
	}
	return r
}

// take removes what a placed attempt holds from the room.
func (r *machineRoom) take(cpu, mem int64, devs []string) {
	r.cpu -= cpu
	r.mem -= mem
	taken := map[string]bool{}
	for _, d := range devs {
		taken[d] = true
	}
	var left []gpuSlot
	for _, g := range r.gpus {
		if !taken[g.id] {
			left = append(left, g)
		}
	}
	r.gpus = left
}
