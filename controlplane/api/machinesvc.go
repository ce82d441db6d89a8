package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

// Presence says which machines hold a tunnel now, and drops one. The
// tunnel registry implements it.
type Presence interface {
	// Online reports whether machineID holds a tunnel, and over which
	// transport.
	Online(machineID string) (transport string, ok bool)
	// Drop closes machineID's tunnel, if any. Idempotent.
	Drop(machineID string)
}

// MachineService implements levers9.v1.MachineService.
type MachineService struct {
	v1.UnimplementedMachineServiceServer
	*Deps
}

func (d *Deps) machinePB(m store.Machine) *v1.Machine {
	pb := &v1.Machine{Id: m.ID, Name: m.Name, Pool: m.Pool, WorkspaceId: m.WorkspaceID, CreatedAt: ts(&m.CreatedAt),
		EnrolledAt: ts(m.EnrolledAt), LastHeartbeat: ts(m.LastHeartbeat), AgentVersion: m.AgentVersion,
		CertificateExpiresAt: ts(m.CertNotAfter), Labels: m.Labels}
	if m.EnrolledAt == nil {
		pb.State = v1.MachineState_MACHINE_STATE_PENDING
		pb.JoinExpiresAt = ts(m.JoinExpiresAt)
	} else {
		pb.State = v1.MachineState_MACHINE_STATE_OFFLINE
		if tr, ok := d.online(m); ok {
			pb.State, pb.Transport = v1.MachineState_MACHINE_STATE_ONLINE, tr
		}
	}
	if len(m.Inventory) > 0 {
		var inv v1.Inventory
		if err := protoJSON.Unmarshal(m.Inventory, &inv); err == nil {
			pb.Inventory = &inv
		}
	}
	return pb
}

func (d *Deps) online(m store.Machine) (string, bool) {
	if m.DeletedAt != nil || m.EnrolledAt == nil {
		return "", false
	}
	return d.Presence.Online(m.ID)
}

// CreateMachine makes a pending machine with a single-use join token and
// the join script that carries it.
func (s *MachineService) CreateMachine(ctx context.Context, req *v1.CreateMachineRequest) (*v1.CreateMachineResponse, error) {
	resp, err := s.createMachine(ctx, req)
	return resp, errdefs.ToGRPC(err)
}

func (s *MachineService) createMachine(ctx context.Context, req *v1.CreateMachineRequest) (*v1.CreateMachineResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, err
	}
	pool := req.GetPool()
	if _, ok := s.Config.Worker.Pools[pool]; !ok {
		return nil, fmt.Errorf("pool %q is not declared (have %v; pools come from worker.pools in the controlplane config): %w",
			pool, s.Config.Worker.PoolNames(), errdefs.ErrInvalidArgument)
	}
	name := req.GetName()
	machineID := ids.New("m")
	if name == "" {
		name = pool + "-" + machineID[2:8]
	}
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	if errs := config.CheckLabels("labels", req.GetLabels()); len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", errors.Join(errs...), errdefs.ErrInvalidArgument)
	}
	labels := req.GetLabels()
	if _, ok := labels[enroll.ClusterAgentLabel]; ok {
		return nil, fmt.Errorf("labels: %s is set by `levers9 cluster join` only: %w", enroll.ClusterAgentLabel, errdefs.ErrInvalidArgument)
	}
	if _, ok := labels[enroll.ClusterWorkerLabel]; ok {
		return nil, fmt.Errorf("labels: %s is set by the controlplane on an attached cluster's workers only: %w", enroll.ClusterWorkerLabel, errdefs.ErrInvalidArgument)
	}
	if req.GetClusterAgent() {
		// A cluster agent makes workers for the whole workspace: joining a
		// cluster is an admin's call, not a machine-join token's.
		if p.Role != store.RoleAdmin {
			return nil, fmt.Errorf("joining a cluster needs an admin token (this one is %s): %w", p.Role, errdefs.ErrPermissionDenied)
		}
		withKind := make(map[string]string, len(labels)+1)
		for k, v := range labels {
			withKind[k] = v
		}
		withKind[enroll.ClusterAgentLabel] = "true"
		labels = withKind
	}
	ttl := s.Config.Controlplane.JoinTokenTTL()
	if req.GetJoinTtlSeconds() != 0 {
		if req.GetJoinTtlSeconds() < 60 || req.GetJoinTtlSeconds() > 7*24*3600 {
			return nil, fmt.Errorf("join_ttl_seconds %d is not between 60 and 604800: %w", req.GetJoinTtlSeconds(), errdefs.ErrInvalidArgument)
		}
		ttl = time.Duration(req.GetJoinTtlSeconds()) * time.Second
	}
	var sums map[string]string
	if req.GetDevBuild() {
		sums, err = s.Dist.DevChecksums(ctx)
	} else {
		sums, err = s.Dist.Checksums(ctx)
	}
	if err != nil {
		return nil, err
	}
	now := s.now()
	jtID, token, hash := enroll.MintJoinToken()
	m := store.Machine{ID: machineID, WorkspaceID: p.WorkspaceID, Name: name, Pool: pool, CreatedAt: now, Labels: labels}
	expires := now.Add(ttl)
	script, err := enroll.JoinScript(enroll.ScriptParams{MachineID: m.ID, Pool: pool, ControlplaneGRPC: s.Public.GRPC,
		ControlplaneREST: s.Public.REST, CAPEM: s.Public.CAPEM, AgentSHA256: sums, Token: token, ExpiresAt: expires, DevBuild: req.GetDevBuild()})
	if err != nil {
		return nil, err
	}
	if err := s.Store.CreateMachine(ctx, m, store.JoinTokenRow{ID: jtID, MachineID: m.ID, Hash: hash, ExpiresAt: expires}); err != nil {
		if errdefs.IsAlreadyExists(err) {
			return nil, fmt.Errorf("a machine named %q exists in this workspace: %w", name, errdefs.ErrAlreadyExists)
		}
		return nil, err
	}
	m.JoinExpiresAt = &expires
	s.Log.Info("machine created", "workspace_id", p.WorkspaceID, "machine_id", m.ID, "pool", pool, "join_token_id", jtID, "labels", m.Labels)
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "machine.created", Object: m.ID})
	return &v1.CreateMachineResponse{Machine: s.machinePB(m), JoinToken: token, JoinScript: script,
		ControlplaneGrpc: s.Public.GRPC, CaPem: s.Public.CAPEM}, nil
}

// ListMachines lists the caller's machines.
func (s *MachineService) ListMachines(ctx context.Context, req *v1.ListMachinesRequest) (*v1.ListMachinesResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	list, err := s.Store.ListMachines(ctx, p.WorkspaceID, req.GetPool())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	resp := &v1.ListMachinesResponse{}
	for _, m := range list {
		resp.Machines = append(resp.Machines, s.machinePB(m))
	}
	return resp, nil
}

// GetMachine describes one machine of the caller's workspace.
func (s *MachineService) GetMachine(ctx context.Context, req *v1.GetMachineRequest) (*v1.GetMachineResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	m, err := s.Store.GetMachine(ctx, p.WorkspaceID, req.GetId())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.GetMachineResponse{Machine: s.machinePB(m)}, nil
}

// DeleteMachine revokes the machine's credential and drops its tunnel.
func (s *MachineService) DeleteMachine(ctx context.Context, req *v1.DeleteMachineRequest) (*v1.DeleteMachineResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	resp := &v1.DeleteMachineResponse{}
	if cur, err := s.Store.GetMachine(ctx, p.WorkspaceID, req.GetId()); err == nil && cur.Labels[enroll.ClusterAgentLabel] == "true" && cur.DeletedAt == nil && s.Tasks != nil {
		// Its worker Jobs go first, while its tunnel still works: once its
		// certificate is revoked nothing can reach that cluster.
		n, offline, err := s.Tasks.RemoveClusterWorkers(ctx, cur)
		if err != nil {
			return nil, errdefs.ToGRPC(fmt.Errorf("removing the worker Jobs of cluster agent %s (it is not deleted; retry, or delete it while it is offline): %w", cur.ID, err))
		}
		resp.ClusterWorkersRemoved, resp.ClusterAgentOffline = int32(n), offline
	}
	m, err := s.Store.DeleteMachine(ctx, p.WorkspaceID, req.GetId())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.Presence.Drop(m.ID)
	s.Log.Info("machine deleted; its certificate is refused from now on", "workspace_id", p.WorkspaceID, "machine_id", m.ID, "pool", m.Pool)
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "machine.deleted", Object: m.ID})
	return resp, nil
}
