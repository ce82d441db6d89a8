package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
	"github.com/levers9/levers9/volumes"
	"github.com/levers9/levers9/volumes/seaweedfs"
)

// VolumeDrivers hands out the controlplane's volume drivers by name.
type VolumeDrivers interface {
	Driver(name string) (volumes.Driver, error)
}

// ConfiguredDrivers are the drivers the controlplane's config enables.
type ConfiguredDrivers struct {
	SeaweedFS *seaweedfs.Driver
}

// Driver returns the named driver, or FAILED_PRECONDITION saying why it
// cannot be used here.
func (c ConfiguredDrivers) Driver(name string) (volumes.Driver, error) {
	switch name {
	case seaweedfs.DriverName:
		if c.SeaweedFS == nil {
			return nil, fmt.Errorf("volume driver seaweedfs: no filer configured (volumes.seaweedfs.filerAddr): %w", errdefs.ErrFailedPrecondition)
		}
		return c.SeaweedFS, nil
	case "juicefs":
		return nil, fmt.Errorf("volume driver juicefs: not available on this controlplane (no juicefs binary or metadata engine configured): %w", errdefs.ErrFailedPrecondition)
	}
	return nil, fmt.Errorf("volume driver %q: want seaweedfs or juicefs: %w", name, errdefs.ErrInvalidArgument)
}

// statsTimeout bounds asking a driver what a volume holds, so a slow
// filesystem slows a listing only so much.
const statsTimeout = 5 * time.Second

// VolumeService implements levers9.v1.VolumeService.
type VolumeService struct {
	v1.UnimplementedVolumeServiceServer
	*Deps
}

func driverVolume(v store.Volume) volumes.Volume {
	return volumes.Volume{ID: v.ID, Workspace: v.WorkspaceID, Name: v.Name, QuotaBytes: v.QuotaBytes}
}

func (s *VolumeService) volumePB(ctx context.Context, v store.Volume) *v1.Volume {
	out := &v1.Volume{Id: v.ID, Name: v.Name, WorkspaceId: v.WorkspaceID, Driver: v.Driver, QuotaBytes: v.QuotaBytes,
		CreatedAt: ts(&v.CreatedAt)}
	if d, err := s.driver(v.Driver); err != nil {
		out.StatsError = err.Error()
	} else {
		sctx, cancel := context.WithTimeout(ctx, statsTimeout)
		st, err := d.Stats(sctx, driverVolume(v))
		cancel()
		if err != nil {
			out.StatsError = err.Error()
		} else {
			out.Stats = &v1.VolumeStats{Bytes: st.Bytes, Files: st.Files, Dirs: st.Dirs}
		}
	}
	if users, err := s.Store.VolumeUsers(ctx, v.WorkspaceID, v.Name); err == nil {
		out.UsedBy = users
	}
	return out
}

func (s *VolumeService) driver(name string) (volumes.Driver, error) {
	if s.Volumes == nil {
		return nil, fmt.Errorf("volumes: none configured on this controlplane: %w", errdefs.ErrFailedPrecondition)
	}
	return s.Volumes.Driver(name)
}

// CreateVolume records the volume, then has its driver make it; when the
// driver fails the record goes again.
func (s *VolumeService) CreateVolume(ctx context.Context, req *v1.CreateVolumeRequest) (*v1.CreateVolumeResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	driverName := req.GetDriver()
	if driverName == "" {
		driverName = seaweedfs.DriverName
	}
	var errs []error
	if err := volumes.ValidateName(req.GetName()); err != nil {
		errs = append(errs, fmt.Errorf("name: %w", err))
	}
	if req.GetQuotaBytes() < 0 {
		errs = append(errs, errInvalid("quota_bytes", "is negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument))
	}
	d, err := s.driver(driverName)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	row, err := s.Store.InsertVolume(ctx, store.Volume{ID: ids.New("vol"), WorkspaceID: p.WorkspaceID, Name: req.GetName(),
		Driver: driverName, QuotaBytes: req.GetQuotaBytes()})
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if err := d.Create(ctx, driverVolume(row)); err != nil {
		if derr := s.Store.DeleteVolumeRow(context.WithoutCancel(ctx), row.ID); derr != nil {
			s.Log.Error("removing the record of a volume its driver could not create", "volume_id", row.ID, "err", derr)
		}
		return nil, errdefs.ToGRPC(fmt.Errorf("create volume %s: %w", row.Name, err))
	}
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "volume.created", Object: row.Name})
	return &v1.CreateVolumeResponse{Volume: s.volumePB(ctx, row)}, nil
}

// ListVolumes lists the workspace's volumes with what each holds.
func (s *VolumeService) ListVolumes(ctx context.Context, _ *v1.ListVolumesRequest) (*v1.ListVolumesResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	list, err := s.Store.ListVolumes(ctx, p.WorkspaceID)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	resp := &v1.ListVolumesResponse{}
	for _, v := range list {
		resp.Volumes = append(resp.Volumes, s.volumePB(ctx, v))
	}
	return resp, nil
}

// GetVolume returns one volume of the workspace.
func (s *VolumeService) GetVolume(ctx context.Context, req *v1.GetVolumeRequest) (*v1.GetVolumeResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	v, err := s.Store.GetVolume(ctx, p.WorkspaceID, req.GetName())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.GetVolumeResponse{Volume: s.volumePB(ctx, v)}, nil
}

// DeleteVolume deletes a volume and its data unless an unfinished task
// mounts it.
func (s *VolumeService) DeleteVolume(ctx context.Context, req *v1.DeleteVolumeRequest) (*v1.DeleteVolumeResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	v, err := s.Store.MarkVolumeDeleting(ctx, p.WorkspaceID, req.GetName())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	d, err := s.driver(v.Driver)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if err := d.Delete(ctx, driverVolume(v)); err != nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("delete volume %s: %w", v.Name, err))
	}
	if err := s.Store.DeleteVolumeRow(ctx, v.ID); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "volume.deleted", Object: v.Name})
	return &v1.DeleteVolumeResponse{}, nil
}
