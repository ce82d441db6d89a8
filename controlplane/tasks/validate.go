package tasks

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/protobuf/proto"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
)

// Defaults and bounds of a task's spec.
const (
	DefaultCPUMillis   = 500
	DefaultMemoryBytes = 256 << 20
	maxRetries         = 10
	maxGPUs            = 64
	maxKeyLen          = 128
	maxCommandEnvBytes = 256 << 10
	// MaxInputBytes bounds TaskSpec.input (the store's column holds no
	// more).
	MaxInputBytes = store.MaxInputBytes
)

var (
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	keyRE    = regexp.MustCompile(`^[\x21-\x7e]+$`)
)

// resolve checks a spec of workspaceID and fills its defaults; every
// problem is named at once. Then it refuses looser security than the
// pool's, and a task no machine of its pool that may serve the workspace
// could ever hold. note, when set, says why the task will wait.
// findings are the volume mounts log mode lets through.
func (s *Submitter) resolve(ctx context.Context, workspaceID string, in *v1.TaskSpec, key string) (spec *v1.TaskSpec, note string, findings []store.MountFinding, err error) {
	spec, _ = proto.Clone(in).(*v1.TaskSpec)
	if spec == nil {
		spec = &v1.TaskSpec{}
	}
	if errs := s.fillAndCheck(spec, key); len(errs) > 0 {
		return nil, "", nil, fmt.Errorf("task spec: %w: %w", errdefs.ErrInvalidArgument, errors.Join(errs...))
	}
	sec, err := s.checkSecurity(spec)
	if err != nil {
		return nil, "", nil, err
	}
	if findings, err = judgeMounts(spec, sec.MountValidation); err != nil {
		return nil, "", nil, err
	}
	if err := s.checkSecrets(ctx, workspaceID, spec); err != nil {
		return nil, "", nil, err
	}
	if err := s.checkVolumes(ctx, workspaceID, spec); err != nil {
		return nil, "", nil, err
	}
	note, err = s.checkFits(ctx, workspaceID, spec)
	if err != nil {
		return nil, "", nil, err
	}
	return spec, note, findings, nil
}

// fillAndCheck fills spec's defaults and returns every problem in it.
func (s *Submitter) fillAndCheck(spec *v1.TaskSpec, key string) []error {
	w := &s.d.config.Worker
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(key) > maxKeyLen || (key != "" && !keyRE.MatchString(key)) {
		bad("idempotency_key: use up to %d printable characters without spaces", maxKeyLen)
	}
	if spec.Pool == "" {
		spec.Pool = "default"
	}
	if _, ok := w.Pools[spec.Pool]; !ok {
		bad("pool %q is not declared (worker.pools has %s)", spec.Pool, strings.Join(w.PoolNames(), ", "))
	}
	if spec.Image == "" {
		spec.Image = w.DefaultImage
		if spec.Image == "" {
			bad("image: none given and the controlplane has no worker.defaultImage")
		}
	}
	if strings.ContainsAny(spec.Image, " \t\n") {
		bad("image %q: a reference has no spaces", spec.Image)
	}
	size := 0
	for k, v := range spec.Env {
		if !envKeyRE.MatchString(k) {
			bad("env %q: not a variable name (letters, digits, '_', not starting with a digit)", k)
		}
		size += len(k) + len(v)
	}
	for _, a := range spec.Command {
		size += len(a)
	}
	if size > maxCommandEnvBytes {
		bad("command and env: %d bytes, more than 256 KiB", size)
	}
	if len(spec.Input) > MaxInputBytes {
		bad("input: %d bytes, more than the 1 MiB (%d bytes) a task may be given; pass larger data in a volume (levers9 volume create)", len(spec.Input), MaxInputBytes)
	}
	switch {
	case spec.CpuMillis == 0:
		spec.CpuMillis = DefaultCPUMillis
	case spec.CpuMillis < 0 || spec.CpuMillis > 1_000_000:
		bad("cpu_millis: %d is not in 1..1000000", spec.CpuMillis)
	}
	switch {
	case spec.MemoryBytes == 0:
		spec.MemoryBytes = DefaultMemoryBytes
	case spec.MemoryBytes < 4<<20:
		bad("memory_bytes: %d is less than 4 MiB", spec.MemoryBytes)
	}
	if spec.Gpus < 0 || spec.Gpus > maxGPUs {
		bad("gpus: %d is not in 0..%d", spec.Gpus, maxGPUs)
	}
	if spec.GetTimeout() != nil && (spec.GetTimeout().CheckValid() != nil || spec.GetTimeout().AsDuration() < 0) {
		bad("timeout: %v is not a duration of zero or more", spec.GetTimeout())
	}
	if spec.Retries < 0 || spec.Retries > maxRetries {
		bad("retries: %d is not in 0..%d", spec.Retries, maxRetries)
	}
	if spec.Cwd != "" && !strings.HasPrefix(spec.Cwd, "/") {
		bad("cwd %q: not an absolute path", spec.Cwd)
	}
	errs = append(errs, checkSecretNames(spec)...)
	errs = append(errs, checkVolumeRefs(spec)...)
	return errs
}

// checkSecurity refuses a task env that asks for looser security than its
// pool (the agent applies the tighter one) and returns what applies.
func (s *Submitter) checkSecurity(spec *v1.TaskSpec) (sandbox.Security, error) {
	w := &s.d.config.Worker
	sec := w.EffectiveSecurity(spec.Pool)
	eff, err := sandbox.Tighten(sandbox.Security{Profile: sandbox.Profile(sec.Profile), Seccomp: sandbox.SeccompMode(sec.Seccomp),
		MountValidation: sandbox.MountValidation(w.EffectiveMountValidation(spec.Pool))}, envList(spec.Env))
	if err != nil {
		return eff, fmt.Errorf("task security in pool %s: %w", spec.Pool, err)
	}
	return eff, nil
}

// checkFits refuses a task no machine of its pool could ever hold, so a
// caller hears it now instead of waiting forever. Only machines that may
// serve the workspace count (tenancy): another workspace's machine in a
// pool that is not shared is as good as absent. An empty pool accepts CPU
// tasks (machines may join), with a note when it is empty only for this
// workspace; GPU tasks need a pool that has GPUs.
func (s *Submitter) checkFits(ctx context.Context, workspaceID string, spec *v1.TaskSpec) (string, error) {
	if p := s.d.config.Worker.Pools[spec.Pool]; p.IsKubernetes() {
		// Its workers are the operator's and are packed for any workspace
		// the pool allows: one it does not allow would wait forever.
		ten, err := s.d.tenancyOf(ctx, spec.Pool, workspaceID)
		if err != nil {
			return "", err
		}
		if !ten.shared {
			return "", fmt.Errorf("pool %q is not shared with this workspace (worker.pools.%s.workspaces): %w", spec.Pool, spec.Pool, errdefs.ErrFailedPrecondition)
		}
		return "", s.checkShape(spec, p)
	}
	all, err := s.d.store.PoolMachines(ctx, spec.Pool)
	if err != nil {
		return "", err
	}
	ten, err := s.d.tenancyOf(ctx, spec.Pool, workspaceID)
	if err != nil {
		return "", err
	}
	var machines []store.PoolMachine
	for _, pm := range all {
		if ten.serves(pm.WorkspaceID) {
			machines = append(machines, pm)
		}
	}
	if fits, msg, err := s.fitsAttached(ctx, spec, ten, machines); err != nil || fits || msg != "" {
		if msg != "" {
			return "", fmt.Errorf("%s: %w", msg, errdefs.ErrFailedPrecondition)
		}
		return "", err
	}
	note, others := "", ""
	if len(machines) < len(all) {
		others = fmt.Sprintf(" (counting only this workspace's machines: the pool is not shared with it, see worker.pools.%s.shared)", spec.Pool)
		if len(machines) == 0 {
			note = fmt.Sprintf("no machine of this workspace in pool %s yet; the machines of other workspaces there serve only their own", spec.Pool)
		}
	}
	pool := s.d.config.Worker.Pools[spec.Pool]
	var most int
	var fitsCPU, fitsAll bool
	known := 0
	for _, pm := range machines {
		c := capacityOf(pm)
		if c.cpu == 0 {
			continue // no inventory yet: its size is unknown
		}
		known++
		most = max(most, len(c.gpus))
		if c.cpu >= spec.CpuMillis && c.mem >= int64(spec.MemoryBytes) {
			fitsCPU = true
			if len(c.matchingGPUs(spec.GpuType)) >= int(spec.Gpus) {
				fitsAll = true
			}
		}
	}
	if spec.Gpus > 0 {
		switch {
		case most == 0 && pool.GPUType == "" && known == len(machines):
			return "", fmt.Errorf("pool %q has no GPUs (none of its %d machines reports one, and it declares no gpuType)%s; choose a GPU pool (levers9 pool list): %w",
				spec.Pool, len(machines), others, errdefs.ErrFailedPrecondition)
		case known > 0 && most < int(spec.Gpus):
			return "", fmt.Errorf("pool %q: the largest machine has %d GPUs, the task asks for %d%s: %w", spec.Pool, most, spec.Gpus, others, errdefs.ErrFailedPrecondition)
		}
	}
	if known > 0 && !fitsAll && (spec.Gpus == 0 || most >= int(spec.Gpus)) {
		what := "CPU and memory"
		if fitsCPU {
			what = fmt.Sprintf("%d GPUs of type %q", spec.Gpus, spec.GpuType)
		}
		return "", fmt.Errorf("pool %q: no machine has %s for this task (%d mCPU, %d bytes)%s: %w", spec.Pool, what, spec.CpuMillis, spec.MemoryBytes, others, errdefs.ErrFailedPrecondition)
	}
	return note, nil
}

// checkShape refuses a task no worker pod of a Kubernetes pool could
// hold: the pool may have no worker now, so its declared shape is what
// counts.
func (s *Submitter) checkShape(spec *v1.TaskSpec, p config.Pool) error {
	if spec.Gpus > 0 && !*s.d.config.Worker.JobResourcesEnforced {
		return fmt.Errorf("pool %q: not enough GPUs available: worker.jobResourcesEnforced is false, so its worker pods cannot request nvidia.com/gpu: %w",
			spec.Pool, errdefs.ErrFailedPrecondition)
	}
	var big []string
	if spec.CpuMillis > p.Shape.Millis() {
		big = append(big, fmt.Sprintf("%d mCPU (shape.cpu %s)", spec.CpuMillis, p.Shape.CPU))
	}
	if int64(spec.MemoryBytes) > p.Shape.Bytes() {
		big = append(big, fmt.Sprintf("%d bytes of memory (shape.memory %s)", spec.MemoryBytes, p.Shape.Memory))
	}
	if int(spec.Gpus) > p.Shape.GPUs {
		if p.Shape.GPUs == 0 {
			return fmt.Errorf("pool %q: not enough GPUs available: its worker pods have none (worker.pools.%s.shape.gpus); choose a GPU pool (levers9 pool list): %w",
				spec.Pool, spec.Pool, errdefs.ErrFailedPrecondition)
		}
		big = append(big, fmt.Sprintf("%d GPUs (shape.gpus %d)", spec.Gpus, p.Shape.GPUs))
	}
	if len(big) > 0 {
		return fmt.Errorf("pool %q: the task asks for more than one worker pod may take: %s: %w", spec.Pool, strings.Join(big, ", "), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// fitsAttached checks a task against the attached clusters of its pool
// that serve the workspace: it fits when the largest node of one of them
// could hold a worker for it (true), and is refused (msg) when it is
// bigger than every such node and no machine of the pool holds it either.
// Without attached clusters it says nothing (false, "").
func (s *Submitter) fitsAttached(ctx context.Context, spec *v1.TaskSpec, ten tenancy, machines []store.PoolMachine) (bool, string, error) {
	agents, err := s.d.store.ClusterAgents(ctx)
	if err != nil {
		return false, "", err
	}
	var largest []string
	for _, m := range agents {
		if m.Pool != spec.Pool || m.WorkspaceID != ten.workspaceID {
			continue // its workers serve the workspace that joined it only
		}
		n := largestNode(m.Inventory)
		if n == nil {
			return true, "", nil // not reported yet: its size is unknown
		}
		if n.CpuMillis >= spec.CpuMillis && n.MemoryBytes >= spec.MemoryBytes && n.Gpus >= spec.Gpus {
			return true, "", nil
		}
		largest = append(largest, fmt.Sprintf("%s's largest node %s has %d mCPU, %d bytes, %d GPUs", m.ID, n.Name, n.CpuMillis, n.MemoryBytes, n.Gpus))
	}
	if len(largest) == 0 {
		return false, "", nil
	}
	for _, pm := range machines {
		c := capacityOf(pm)
		if c.cpu >= spec.CpuMillis && c.mem >= int64(spec.MemoryBytes) && len(c.matchingGPUs(spec.GpuType)) >= int(spec.Gpus) {
			return true, "", nil
		}
	}
	return false, fmt.Sprintf("pool %q: the task (%d mCPU, %d bytes, %d GPUs) is bigger than any node of the attached cluster serving it (%s), and no machine of the pool holds it",
		spec.Pool, spec.CpuMillis, spec.MemoryBytes, spec.Gpus, strings.Join(largest, "; ")), nil
}
