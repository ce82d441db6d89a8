package taskrun

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/volumes"
)

// Volume is one volume of a task as the controlplane resolved it for this
// attempt.
type Volume struct {
	volumes.Volume
	// TaskWorkspace is the task's workspace; a volume of another one is
	// refused.
	TaskWorkspace string
	Driver        string
	// Path is the container path; ReadOnly the mode.
	Path     string
	ReadOnly bool
	// FilerAddr and FilerURL reach the seaweedfs filer.
	FilerAddr, FilerURL string
	// Env is credentials for the mount process (seaweed.MountCredentials
	// as KEY=VALUE): never logged, never in the saved state; the driver
	// writes them to 0600 files for the mount process only.
	Env []string `json:"-"`
}

// VolumeMounter mounts volumes on the node, shared by the attempts that
// use the same volume in the same mode: Acquire mounts on first use and
// returns the host path; Release unmounts after the last. Safe for
// concurrent use.
type VolumeMounter interface {
	Acquire(ctx context.Context, v Volume) (string, error)
	Release(ctx context.Context, v Volume) error
}

// volumeHook mounts the task's volumes on the node and binds them into
// the container. It judges the volume side of mount validation itself
// (checkVolumes); the sandbox forces nosuid,nodev on the bind.
// The host side is the agent's own FUSE mount, so the binds go out as the
// agent's mounts, never as host paths a task named.
type volumeHook struct {
	mounter VolumeMounter

	// mu guards acquired and sources (the host path of each).
	mu       sync.Mutex
	acquired []Volume
	sources  []string
}

var (
	_ Prestarter  = (*volumeHook)(nil)
	_ besideImage = (*volumeHook)(nil)
	_ Stopper     = (*volumeHook)(nil)
)

func (*volumeHook) besideImage() {}

func (h *volumeHook) Name() string { return "volumes" }

// checkVolumes reports every volume the task may not mount: a volume of
// another workspace always; a path no volume may take (over /proc, /etc,
// "/"...) unless the task's volume mount validation is log, which the
// controlplane reported at submit. An unset mode (a controlplane that does
// not push one) refuses, as before modes existed.
func checkVolumes(t Task) error {
	mode := t.Security.MountValidation
	if eff, err := sandbox.Tighten(t.Security, t.Env); err == nil {
		mode = eff.MountValidation
	}
	var errs []error
	for i, v := range t.Volumes {
		if v.Workspace == "" || v.Workspace != v.TaskWorkspace {
			errs = append(errs, fmt.Errorf("task.volumes[%d] %s: belongs to another workspace: %w", i, v.Name, errdefs.ErrPermissionDenied))
		}
		if err := volumes.ValidateTarget(v.Path); err != nil {
			errs = append(errs, fmt.Errorf("task.volumes[%d] %s: %w", i, v.Name, err))
		} else if why := volumes.UnsafeTarget(v.Path); why != "" && mode != sandbox.MountValidationLog {
			errs = append(errs, fmt.Errorf("task.volumes[%d] %s at %s: %s (worker.volumeMountValidation enforce): %w", i, v.Name, v.Path, why, errdefs.ErrPermissionDenied))
		}
	}
	return errors.Join(errs...)
}

func (h *volumeHook) Prestart(ctx context.Context, req *PrestartRequest, resp *PrestartResponse) error {
	if len(req.Task.Volumes) == 0 {
		return nil
	}
	if err := checkVolumes(req.Task); err != nil {
		return withReason(ReasonMountFailed, "a volume of the task was refused on this machine", err)
	}
	if h.mounter == nil {
		return withReason(ReasonMountFailed, "this machine cannot mount volumes",
			fmt.Errorf("mount volumes: the agent has no volume mounter: %w", errdefs.ErrFailedPrecondition))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// Idempotent: a second Prestart binds what the first mounted.
	for i := len(h.acquired); i < len(req.Task.Volumes); i++ {
		v := req.Task.Volumes[i]
		src, err := h.mounter.Acquire(ctx, v)
		if err != nil {
			return withReason(ReasonMountFailed, fmt.Sprintf("volume %s could not be mounted on this machine", v.Name),
				fmt.Errorf("mount volume %s: %w", v.Name, err))
		}
		h.acquired = append(h.acquired, v)
		h.sources = append(h.sources, src)
	}
	for i, v := range req.Task.Volumes {
		resp.Mounts = append(resp.Mounts, sandbox.Mount{Source: h.sources[i], Destination: v.Path, ReadOnly: v.ReadOnly})
	}
	return nil
}

func (h *volumeHook) Stop(ctx context.Context, req *StopRequest) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for _, v := range h.acquired {
		errs = append(errs, h.mounter.Release(ctx, v))
	}
	h.acquired, h.sources = nil, nil
	return errors.Join(errs...)
}
