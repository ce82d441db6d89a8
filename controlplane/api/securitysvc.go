package api

import (
	"context"
	"fmt"
	"sort"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/internal/errdefs"
)

// maxDestinations bounds the sampled destinations a merged report lists.
const maxDestinations = 50

// seccompWindow is how far back the seccomp part of a report looks: tasks
// created within it (their event streams are kept as long).
const seccompWindow = 7 * 24 * time.Hour

// SecurityService implements levers9.v1.SecurityService.
type SecurityService struct {
	v1.UnimplementedSecurityServiceServer
	*Deps
}

// GetReadinessReport merges the latest egress reports of the caller's
// machines in a pool.
func (s *SecurityService) GetReadinessReport(ctx context.Context, req *v1.GetReadinessReportRequest) (*v1.GetReadinessReportResponse, error) {
	rep, err := s.readiness(ctx, req.GetPool())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	sc, err := s.seccomp(ctx, req.GetPool())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	mounts, err := s.mounts(ctx, req.GetPool())
	return &v1.GetReadinessReportResponse{Report: rep, Seccomp: sc, Mounts: mounts}, errdefs.ToGRPC(err)
}

// mounts is what volume mount validation judged for the caller's tasks of
// a pool over seccompWindow (as long as their events are kept). Safe to
// enforce means: tasks of the pool mounted volumes and none had a mount
// enforce would refuse.
func (s *SecurityService) mounts(ctx context.Context, pool string) (*v1.MountReport, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, err
	}
	got, err := s.Store.PoolMountFindings(ctx, p.WorkspaceID, pool, s.now().Add(-seccompWindow))
	if err != nil {
		return nil, err
	}
	out := &v1.MountReport{Mode: s.Config.Worker.EffectiveMountValidation(pool), TasksWithVolumes: uint32(got.WithVolumes),
		TasksWithFindings: uint32(got.WithFindings), SafeToEnforce: got.WithVolumes > 0 && got.WithFindings == 0}
	for _, f := range got.Findings {
		out.Findings = append(out.Findings, &v1.MountTaskFinding{TaskId: f.TaskID,
			Finding: &v1.MountFinding{Volume: f.Volume, Path: f.Path, Reason: f.Reason}})
	}
	return out, nil
}

// seccomp sums what seccomp log mode recorded for the caller's tasks of a
// pool over seccompWindow. Safe to enforce means: tasks ran under log mode
// and none made a syscall enforce would refuse.
func (s *SecurityService) seccomp(ctx context.Context, pool string) (*v1.SeccompReport, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, err
	}
	got, err := s.Store.PoolSeccomp(ctx, p.WorkspaceID, pool, s.now().Add(-seccompWindow))
	if err != nil {
		return nil, err
	}
	out := &v1.SeccompReport{Mode: s.Config.Worker.EffectiveSecurity(pool).Seccomp, TasksObserved: uint32(got.Observed)}
	for _, c := range got.Syscalls {
		out.Total += uint64(c.Count)
		out.Syscalls = append(out.Syscalls, &v1.SeccompSyscallReport{Syscall: c.Syscall, Count: uint64(c.Count),
			Tasks: uint32(c.Tasks), TaskIds: c.TaskIDs})
	}
	out.SafeToEnforce = got.Observed > 0 && out.Total == 0
	return out, nil
}

func (s *SecurityService) readiness(ctx context.Context, pool string) (*v1.ReadinessReport, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := s.Config.Worker.Pools[pool]; !ok {
		return nil, fmt.Errorf("pool %q is not declared (have %v): %w", pool, s.Config.Worker.PoolNames(), errdefs.ErrInvalidArgument)
	}
	machines, err := s.Store.ListMachines(ctx, p.WorkspaceID, pool)
	if err != nil {
		return nil, err
	}
	var enrolled []string
	for _, m := range machines {
		if m.EnrolledAt != nil {
			enrolled = append(enrolled, m.ID)
		}
	}
	raw, err := s.Bus.EgressReports(ctx, enrolled)
	if err != nil {
		return nil, err
	}
	out := &v1.ReadinessReport{Pool: pool, Mode: s.Config.Worker.EffectiveSecurity(pool).Egress.Mode}
	classes := map[string]uint64{}
	tasks := map[[2]string]uint64{}
	dests := map[[3]string]uint64{}
	for _, id := range enrolled {
		b, ok := raw[id]
		if !ok {
			out.MachinesSilent = append(out.MachinesSilent, id)
			continue
		}
		var r v1.ReadinessReport
		if err := protojson.Unmarshal(b, &r); err != nil {
			s.Log.Warn("unreadable egress report", "machine_id", id, "err", err)
			out.MachinesSilent = append(out.MachinesSilent, id)
			continue
		}
		out.MachinesReporting++
		if r.Blind != "" {
			out.MachinesBlind = append(out.MachinesBlind, id+": "+r.Blind)
		}
		out.Total += r.Total
		if r.From != nil && (out.From == nil || r.From.AsTime().Before(out.From.AsTime())) {
			out.From = r.From
		}
		if r.To != nil && (out.To == nil || r.To.AsTime().After(out.To.AsTime())) {
			out.To = r.To
		}
		for _, c := range r.ByClass {
			classes[c.Class] += c.Count
		}
		for _, t := range r.ByTask {
			tasks[[2]string{t.Task, t.Class}] += t.Count
		}
		for _, d := range r.Destinations {
			dests[[3]string{d.Class, d.Destination, d.Task}] += d.Samples
		}
	}
	for c, n := range classes {
		out.ByClass = append(out.ByClass, &v1.EgressClassCount{Class: c, Count: n})
	}
	sort.Slice(out.ByClass, func(i, j int) bool {
		a, b := out.ByClass[i], out.ByClass[j]
		return a.Count > b.Count || (a.Count == b.Count && a.Class < b.Class)
	})
	for k, n := range tasks {
		out.ByTask = append(out.ByTask, &v1.EgressTaskCount{Task: k[0], Class: k[1], Count: n})
	}
	sort.Slice(out.ByTask, func(i, j int) bool {
		a, b := out.ByTask[i], out.ByTask[j]
		return a.Count > b.Count || (a.Count == b.Count && a.Task+a.Class < b.Task+b.Class)
	})
	for k, n := range dests {
		out.Destinations = append(out.Destinations, &v1.EgressDestination{Class: k[0], Destination: k[1], Task: k[2], Samples: n})
	}
	sort.Slice(out.Destinations, func(i, j int) bool {
		a, b := out.Destinations[i], out.Destinations[j]
		return a.Samples > b.Samples || (a.Samples == b.Samples && a.Destination+a.Task < b.Destination+b.Task)
	})
	if len(out.Destinations) > maxDestinations {
		out.Destinations = out.Destinations[:maxDestinations]
	}
	sort.Strings(out.MachinesSilent)
	sort.Strings(out.MachinesBlind)
	// Safe means: machines did report, each could see its containers'
	// traffic, and nothing would have been refused.
	out.SafeToEnforce = out.MachinesReporting > 0 && out.Total == 0 && len(out.MachinesBlind) == 0
	return out, nil
}
