package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// Config configures a Sandbox. Zero fields take the defaults below.
type Config struct {
	// Prefix starts every container ID, cgroup and state directory, so
	// Reconcile only ever touches what a sandbox made. Default "l9s".
	Prefix string
	// StateDir holds one directory per container (bundle, state root,
	// runtime log). Default /run/<Prefix>.
	StateDir string
	// CgroupParent is the cgroup every container is placed under.
	// Default /<Prefix>.
	CgroupParent string
	// RuncPath and RunscPath default to runc and runsc on PATH.
	RuncPath, RunscPath string
	// MountValidation is worker.volumeMountValidation; default log.
	MountValidation MountValidation
	// SensitivePaths are added to the built-in list (the agent's state
	// dir and socket).
	SensitivePaths []string
	// Host is the node; DetectHost fills it.
	Host Host
	// SeccompLog, when set, is told which task each container runs, so
	// log-mode records are attributed to tasks. Its loop is the caller's
	// to Start and Stop.
	SeccompLog *SeccompLogReader
	Logger     *slog.Logger
}

// Sandbox runs tasks as hardened containers. It is safe for concurrent use.
type Sandbox struct {
	cfg      Config
	logger   *slog.Logger
	mounts   MountValidator
	runtimes map[RuntimeName]Runtime
}

// New checks the config and finds the runtimes. A runtime binary that is
// missing makes only tasks asking for it fail.
func New(cfg Config) (*Sandbox, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "l9s"
	}
	if cfg.StateDir == "" {
		cfg.StateDir = "/run/" + cfg.Prefix
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "/" + cfg.Prefix
	}
	if cfg.MountValidation == "" {
		cfg.MountValidation = MountValidationLog
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MountValidation != MountValidationLog && cfg.MountValidation != MountValidationEnforce {
		return nil, fmt.Errorf("worker.volumeMountValidation: %q is not log or enforce: %w", cfg.MountValidation, errdefs.ErrInvalidArgument)
	}
	s := &Sandbox{
		cfg:      cfg,
		logger:   cfg.Logger.With("component", "sandbox"),
		runtimes: map[RuntimeName]Runtime{},
		mounts: MountValidator{Mode: cfg.MountValidation, Logger: cfg.Logger,
			Extra: append([]string{cfg.StateDir}, cfg.SensitivePaths...)},
	}
	for name, bin := range map[RuntimeName]string{RuntimeRunc: cfg.RuncPath, RuntimeRunsc: cfg.RunscPath} {
		rt, err := NewOCI(name, bin, cfg.StateDir, cfg.Logger)
		if err != nil {
			s.logger.Warn("runtime unavailable", "runtime", string(name), "err", err)
			continue
		}
		s.runtimes[name] = rt
	}
	return s, nil
}

// Close ends what the sandbox keeps ready for the next container (each
// runtime's spare holder process); containers already started go on.
func (s *Sandbox) Close() {
	for _, rt := range s.runtimes {
		if c, ok := rt.(interface{ Close() }); ok {
			c.Close()
		}
	}
}

// Runtime returns the named runtime, for callers that drive containers
// step by step.
func (s *Sandbox) Runtime(name RuntimeName) (Runtime, error) {
	rt, ok := s.runtimes[name]
	if !ok {
		return nil, errdefs.WithRetry(fmt.Errorf("runtime %s: not installed: %w", name, errdefs.ErrFailedPrecondition), false)
	}
	return rt, nil
}

// ContainerID is the container a task runs in.
func (s *Sandbox) ContainerID(taskID string) string { return s.cfg.Prefix + "-" + taskID }

// Stdio is where a container's output goes; nil discards.
type Stdio struct {
	Stdout, Stderr io.Writer
}

// Handle is a started container.
type Handle struct {
	ID         string
	Effective  Effective
	Violations []Violation
	// Timing is where Run's time went (zero on a reattached handle).
	Timing StartTiming
	rt     Runtime
	// cgroup is the container's cgroup path (the spec's cgroupsPath).
	cgroup string
}

// StartTiming splits Run: building the spec and writing the bundle
// (Prepare), the Runtime's Create and its Start. Which of the last two
// does the work is the runtime's: OCI only records the container at
// Create and runs `runc run` (namespaces, mounts, cgroup, seccomp, the
// process) in Start.
type StartTiming struct {
	Prepare, Create, Start time.Duration
}

// Wait blocks until the container exits or ctx ends.
func (h *Handle) Wait(ctx context.Context) (ExitStatus, error) { return h.rt.Wait(ctx, h.ID) }

// Kill signals the container's process.
func (h *Handle) Kill(ctx context.Context, sig syscall.Signal) error {
	return h.rt.Kill(ctx, h.ID, sig)
}

// State reports the container's state.
func (h *Handle) State(ctx context.Context) (State, error) { return h.rt.State(ctx, h.ID) }

// Delete kills (if needed) and removes the container and its directory.
// Idempotent.
func (h *Handle) Delete(ctx context.Context) error { return h.rt.Delete(ctx, h.ID) }

// mountValidator is the node's validator, switched to enforce when the
// pool's pushed settings say enforce (the stricter of the two wins).
func (s *Sandbox) mountValidator(sec Security) MountValidator {
	v := s.mounts
	if sec.MountValidation == MountValidationEnforce {
		v.Mode = MountValidationEnforce
	}
	return v
}

// Run tightens the pool's settings with the task's requests, validates the
// task's volumes (Mounts, not the agent's own AgentMounts), builds the spec, and creates and starts the container.
// The caller must Delete the handle.
func (s *Sandbox) Run(ctx context.Context, task TaskSpec, pool Security, stdio Stdio) (*Handle, error) {
	began := time.Now()
	sec, err := Tighten(pool.WithDefaults(), task.Env)
	if err != nil {
		return nil, errdefs.WithRetry(fmt.Errorf("task %s: %w", task.ID, err), false)
	}
	rt, err := s.Runtime(sec.Runtime)
	if err != nil {
		return nil, fmt.Errorf("task %s: %w", task.ID, err)
	}
	viol, err := s.mountValidator(sec).Check(ctx, task.ID, task.Mounts)
	if err != nil {
		return nil, errdefs.WithRetry(err, false)
	}
	spec, eff, err := BuildSpec(task, sec, s.cfg.Host)
	if err != nil {
		return nil, errdefs.WithRetry(err, false)
	}
	id := s.ContainerID(task.ID)
	spec.Linux.CgroupsPath = s.cfg.CgroupParent + "/" + id
	bundle := filepath.Join(s.cfg.StateDir, "bundles", id)
	// The runtime reads the secrets from the bundle once, as it starts the
	// container; the bundle then goes back to the spec without them.
	withSecrets := spec
	if len(task.SecretEnv) > 0 {
		full, proc := *spec, *spec.Process
		proc.Env = withSecretEnv(spec.Process.Env, task.SecretEnv)
		full.Process = &proc
		withSecrets = &full
	}
	if err := writeBundle(bundle, withSecrets); err != nil {
		_ = os.RemoveAll(bundle)
		return nil, errdefs.WithRetry(fmt.Errorf("task %s: %w", task.ID, err), true)
	}
	opts := CreateOpts{
		Bundle: bundle, Stdout: stdio.Stdout, Stderr: stdio.Stderr,
		OwnNetwork: task.NetNSPath == "",
		NetRaw:     slices.Contains(spec.Process.Capabilities.Bounding, "CAP_NET_RAW"),
	}
	var timing StartTiming
	created := time.Now()
	timing.Prepare = created.Sub(began)
	if err := rt.Create(ctx, id, opts); err != nil {
		_ = os.RemoveAll(bundle)
		return nil, fmt.Errorf("task %s: %w", task.ID, err)
	}
	timing.Create = time.Since(created)
	if v, ok := rt.(Versioner); ok {
		// Best effort: the container runs either way, and an empty
		// version claims nothing.
		if eff.RuntimeVersion, err = v.Version(ctx); err != nil {
			s.logger.Warn("runtime version unknown", "task_id", task.ID, "runtime", string(sec.Runtime), "err", err)
		}
	}
	h := &Handle{ID: id, Effective: eff, Violations: viol, Timing: timing, cgroup: spec.Linux.CgroupsPath, rt: &bundleCleanup{Runtime: rt, bundle: bundle, seccomp: s.cfg.SeccompLog}}
	if s.cfg.SeccompLog != nil {
		s.cfg.SeccompLog.Track(id, task.ID)
	}
	startedAt := time.Now()
	err = rt.Start(ctx, id)
	h.Timing.Start = time.Since(startedAt)
	if err == nil && withSecrets != spec {
		// Started: the runtime has read the spec (runc and runsc read it
		// before they write the pid file Start waits for).
		if err = writeBundle(bundle, spec); err != nil {
			err = errdefs.WithRetry(fmt.Errorf("take the secrets out of the bundle: %w", err), true)
		}
	}
	if err != nil {
		// Delete removes the bundle, secrets and all; the secrets go even
		// when it fails.
		_ = h.Delete(context.WithoutCancel(ctx))
		if withSecrets != spec {
			_ = os.Remove(filepath.Join(bundle, "config.json"))
		}
		return nil, fmt.Errorf("task %s: %w", task.ID, err)
	}
	s.logger.Debug("container started", "task_id", task.ID, "container_id", id, "runtime", string(sec.Runtime))
	return h, nil
}

// Reattach adopts the container of a task (TaskSpec.ID) that an earlier
// process started and left behind, running or exited: its output from the
// given offsets on goes to stdio, and the handle waits, kills and deletes it
// like one Run returned. Effective is unknown (zero) on such a handle.
// NotFound when no container of the task is left.
func (s *Sandbox) Reattach(ctx context.Context, taskID string, opts ReattachOpts) (*Handle, error) {
	id := s.ContainerID(taskID)
	name, err := os.ReadFile(filepath.Join(s.cfg.StateDir, id, "runtime"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.WithRetry(fmt.Errorf("task %s: reattach container %s: %w", taskID, id, errdefs.ErrNotFound), false)
	}
	if err != nil {
		return nil, fmt.Errorf("task %s: reattach container %s: %w", taskID, id, err)
	}
	rt, ok := s.runtimes[RuntimeName(name)].(*OCI)
	if !ok {
		return nil, errdefs.WithRetry(fmt.Errorf("task %s: reattach container %s: runtime %q not installed: %w", taskID, id, name, errdefs.ErrFailedPrecondition), false)
	}
	if err := rt.Reattach(ctx, id, opts); err != nil {
		return nil, fmt.Errorf("task %s: %w", taskID, err)
	}
	bundle := filepath.Join(s.cfg.StateDir, "bundles", id)
	if s.cfg.SeccompLog != nil {
		s.cfg.SeccompLog.Track(id, taskID)
	}
	s.logger.Info("container reattached", "task_id", taskID, "container_id", id, "runtime", string(name))
	return &Handle{ID: id, cgroup: s.cfg.CgroupParent + "/" + id, rt: &bundleCleanup{Runtime: rt, bundle: bundle, seccomp: s.cfg.SeccompLog}}, nil
}

// Left reports whether an earlier process left a container of the task
// (TaskSpec.ID) that Reattach can adopt.
func (s *Sandbox) Left(taskID string) bool {
	_, err := os.Stat(filepath.Join(s.cfg.StateDir, s.ContainerID(taskID), metaFile))
	return err == nil
}

// bundleCleanup removes the bundle and stops attributing seccomp records
// after the runtime deleted the container.
type bundleCleanup struct {
	Runtime
	bundle  string
	seccomp *SeccompLogReader
}

func (b *bundleCleanup) Delete(ctx context.Context, id string) error {
	if err := b.Runtime.Delete(ctx, id); err != nil {
		return err
	}
	if b.seccomp != nil {
		b.seccomp.Untrack(id)
	}
	if err := os.RemoveAll(b.bundle); err != nil {
		return fmt.Errorf("delete container %s: bundle: %w", id, err)
	}
	return nil
}

func writeBundle(dir string, spec any) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	// A new file renamed over the old: a secret-bearing config.json is
	// unlinked whole, never truncated in place.
	tmp := filepath.Join(dir, "config.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write bundle: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "config.json")); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write bundle: %w", err)
	}
	return nil
}

// Reconcile removes what a killed agent or test left behind: every
// container directory under StateDir whose name carries the prefix is
// force-deleted with the runtime recorded in it, then its bundle and its
// cgroups are removed. Call it before starting tasks; it must not run
// while this Sandbox has live containers.
func (s *Sandbox) Reconcile(ctx context.Context) error { return s.ReconcileExcept(ctx, nil) }

// ReconcileExcept is Reconcile sparing the containers of the tasks in keep
// (TaskSpec.IDs), which a restarted agent reattaches.
func (s *Sandbox) ReconcileExcept(ctx context.Context, keep []string) error {
	kept := map[string]bool{}
	for _, k := range keep {
		kept[s.ContainerID(k)] = true
	}
	entries, err := os.ReadDir(s.cfg.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		removeCgroups(s.cfg.CgroupParent)
		return nil
	}
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	var errs []error
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !strings.HasPrefix(id, s.cfg.Prefix+"-") || kept[id] {
			continue
		}
		dir := filepath.Join(s.cfg.StateDir, id)
		name, _ := os.ReadFile(filepath.Join(dir, "runtime"))
		if rt, ok := s.runtimes[RuntimeName(name)].(*OCI); ok {
			// Kill first and give a surviving `run` parent the chance to
			// clean up after itself: racing it with a forced delete
			// makes runsc time out. runc runs with --keep, so its parent
			// never removes the container: once it is stopped it only
			// waits for the delete below (waiting for it to disappear
			// cost each leftover the loop's full 5-10 s).
			_, _ = rt.exec(ctx, dir, CreateOpts{}, "kill", id, "9")
			for i := 0; i < 100; i++ {
				out, err := rt.exec(ctx, dir, CreateOpts{}, "state", id)
				if err != nil {
					break
				}
				var st State
				if rt.name == RuntimeRunc && json.Unmarshal(out, &st) == nil && st.Status == StatusStopped {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if _, err := rt.exec(ctx, dir, CreateOpts{}, "delete", "--force", id); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("reconcile container %s: %w", id, err))
				continue
			}
		}
		if err := removeContainerDir(dir); err != nil {
			errs = append(errs, fmt.Errorf("reconcile container %s: %w", id, err))
		}
		removeCgroups(s.cfg.CgroupParent + "/" + id)
		s.logger.Info("reconciled leftover container", "container_id", id)
	}
	bundles, _ := os.ReadDir(filepath.Join(s.cfg.StateDir, "bundles"))
	for _, b := range bundles {
		if strings.HasPrefix(b.Name(), s.cfg.Prefix+"-") {
			if _, err := os.Stat(filepath.Join(s.cfg.StateDir, b.Name())); errors.Is(err, os.ErrNotExist) {
				_ = os.RemoveAll(filepath.Join(s.cfg.StateDir, "bundles", b.Name()))
			}
		}
	}
	if len(errs) == 0 && len(kept) == 0 {
		// Empty leftovers only: rmdir refuses a parent still in use.
		_ = syscall.Rmdir(filepath.Join(s.cfg.StateDir, "bundles"))
		_ = syscall.Rmdir(s.cfg.StateDir)
		removeCgroups(s.cfg.CgroupParent)
	}
	return errors.Join(errs...)
}

// removeCgroups removes a container's (empty) cgroup directories under
// every v1 hierarchy or the v2 root; rmdir refuses non-empty ones.
// ReleaseCgroups removes the cgroup parent of this sandbox's containers
// in every hierarchy where it is empty (an agent leaving left one per
// controller, hundreds on a test machine); a container still in it keeps
// it, since the kernel refuses to remove a cgroup with children.
func (s *Sandbox) ReleaseCgroups() { removeCgroups(s.cfg.CgroupParent) }

func removeCgroups(path string) {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + path)
	dirs = append(dirs, "/sys/fs/cgroup"+path)
	for _, d := range dirs {
		_ = syscall.Rmdir(d)
	}
}
