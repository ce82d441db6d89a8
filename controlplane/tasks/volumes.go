package tasks

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protojson"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/volumes"
	"github.com/levers9/levers9/volumes/seaweedfs"
)

// Task volumes. A task names volumes of its workspace (TaskSpec.volumes,
// NAME at a container path, optionally read-only). Submit checks the
// names and paths, judges where they mount (volume mount validation: never
// over /proc, /sys, /dev, /etc or "/" under enforce, reported under log),
// and that each volume exists and is not being deleted; the task row keeps the
// references only. The Scheduler resolves them when it pushes an attempt
// and sends the node what it needs to mount each (TaskAttempt.volumes),
// for that push only; a volume deleted by then fails the attempt.

// maxTaskVolumes bounds how many volumes one task mounts.
const maxTaskVolumes = 16

// checkVolumeRefs reports bad or repeated references in spec.volumes.
func checkVolumeRefs(spec *v1.TaskSpec) []error {
	var errs []error
	if len(spec.Volumes) > maxTaskVolumes {
		errs = append(errs, fmt.Errorf("volumes: %d named, at most %d", len(spec.Volumes), maxTaskVolumes))
	}
	paths := map[string]bool{}
	for i, r := range spec.Volumes {
		ref := volumes.Ref{Name: r.GetName(), Path: r.GetPath(), ReadOnly: r.GetReadOnly()}
		if err := ref.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("volumes[%d]: %w", i, err))
			continue
		}
		if paths[ref.Path] {
			errs = append(errs, fmt.Errorf("volumes[%d] %s: path %s mounted twice", i, ref, ref.Path))
		}
		paths[ref.Path] = true
	}
	return errs
}

// judgeMounts applies volume mount validation to the paths of
// spec.volumes: under enforce a path no volume may take (over /proc, /etc,
// "/"...) refuses the task, naming each; under log each is a finding the
// task keeps and reports.
func judgeMounts(spec *v1.TaskSpec, mode sandbox.MountValidation) ([]store.MountFinding, error) {
	var out []store.MountFinding
	for _, r := range spec.Volumes {
		if why := volumes.UnsafeTarget(r.GetPath()); why != "" {
			out = append(out, store.MountFinding{Volume: r.GetName(), Path: r.GetPath(), Reason: why})
		}
	}
	if len(out) == 0 || mode != sandbox.MountValidationEnforce {
		return out, nil
	}
	errs := make([]error, len(out))
	for i, f := range out {
		errs[i] = fmt.Errorf("volume %s at %s: %s", f.Volume, f.Path, f.Reason)
	}
	return nil, fmt.Errorf("task spec: pool %s has worker.volumeMountValidation enforce: %w: %w", spec.Pool, errdefs.ErrPermissionDenied, errors.Join(errs...))
}

// checkVolumes refuses a task naming a volume its workspace does not have
// (NotFound) or one being deleted (FailedPrecondition).
func (s *Submitter) checkVolumes(ctx context.Context, workspaceID string, spec *v1.TaskSpec) error {
	var missing, deleting []error
	for _, r := range spec.Volumes {
		v, err := s.d.store.GetVolume(ctx, workspaceID, r.GetName())
		switch {
		case errdefs.IsNotFound(err):
			missing = append(missing, fmt.Errorf("volume %q does not exist in this workspace (levers9 volume list shows them; levers9 volume create %s makes it)", r.GetName(), r.GetName()))
		case err != nil:
			return err
		case v.State != store.VolumeReady:
			deleting = append(deleting, fmt.Errorf("volume %q is being deleted", r.GetName()))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("task spec: %w: %w", errdefs.ErrNotFound, errors.Join(missing...))
	}
	if len(deleting) > 0 {
		return fmt.Errorf("task spec: %w: %w", errdefs.ErrFailedPrecondition, errors.Join(deleting...))
	}
	return nil
}

// attachVolumes fills ta.Volumes with what the node needs to mount the
// task's volumes, resolved now and for this workspace only.
func (s *Scheduler) attachVolumes(ctx context.Context, t store.Task, ta *agentv1.TaskAttempt) error {
	spec := &v1.TaskSpec{}
	if err := protojson.Unmarshal(t.Spec, spec); err != nil {
		return fmt.Errorf("decode the spec of task %s: %w", t.ID, err)
	}
	sw := s.d.config.Volumes.SeaweedFS
	for _, r := range spec.Volumes {
		v, err := s.d.store.GetVolume(ctx, t.WorkspaceID, r.GetName())
		if errdefs.IsNotFound(err) || (err == nil && v.State != store.VolumeReady) {
			return &unrunnable{summary: fmt.Sprintf("volume %q was deleted after the task was submitted", r.GetName())}
		}
		if err != nil {
			return err
		}
		vm := &agentv1.VolumeMount{
			VolumeId: v.ID, Name: v.Name, WorkspaceId: v.WorkspaceID, TaskWorkspaceId: t.WorkspaceID,
			Driver: v.Driver, Path: r.GetPath(), ReadOnly: r.GetReadOnly(), QuotaBytes: v.QuotaBytes,
			FilerAddr: sw.FilerAddr, FilerUrl: sw.FilerURL,
		}
		if v.Driver == seaweedfs.DriverName {
			// The mount credentials, for this push only: the node writes
			// them to 0600 files for weed mount.
			vm.Env = slices.Clone(s.d.volumeMountEnv)
		}
		ta.Volumes = append(ta.Volumes, vm)
	}
	return nil
}
