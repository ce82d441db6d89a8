package taskrun

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
)

// Task is one attempt of a task as this node runs it.
type Task struct {
	// ID is the controlplane's task ID; Attempt numbers its attempts from 1.
	ID      string
	Attempt int
	// Pool names the pool, for egress labels and logs.
	Pool string
	// Image is the image reference; a reference without a registry
	// resolves against the node's worker.imageRegistry. A digest reference
	// that is cached needs no network; a tag is resolved against the
	// registry on every attempt (its blobs still come from the cache).
	Image string
	// Args replace the image's command (Cmd) when set; the image's
	// entrypoint stays in front, as with docker run.
	Args []string
	// Env is KEY=VALUE entries added after the image's own.
	Env []string
	// SecretEnv is the task's secrets as KEY=VALUE, added after Env. The
	// Runner hands them to the sandbox and nothing else: they are not in
	// attempt records, events or logs (SecretEnv prints keys only).
	SecretEnv sandbox.SecretEnv
	// User and Cwd override the image's user and working directory.
	User string
	Cwd  string
	// Resources are the cgroup limits (zero: unlimited).
	Resources sandbox.Resources
	// GPUs is how many whole GPUs the task asked for; GPUDevices are the
	// ones the agent assigned (indexes or UUIDs), exactly GPUs of them.
	GPUs       int
	GPUDevices []string
	// Volumes are the task's volumes, mounted on the node and bound into
	// the container by the volume hook.
	Volumes []Volume
	// Timeout bounds the container's run time (not the pull); zero means
	// none.
	Timeout time.Duration
	// Security is the pool's effective worker.containerSecurity; the
	// task's LEVERS9_SECURITY_PROFILE / LEVERS9_SECCOMP in Env may only
	// tighten it.
	Security sandbox.Security
	// Network is the pool's network security (egress mode and allow list);
	// nil uses the node's. Ignored when the Runner has no egress node.
	Network *egress.SecurityConfig
	// RegistryAuth is the workspace's login to the image's registry (host
	// -> credentials), handed down with this attempt: the image hook uses
	// it for this attempt's pull only, and nothing stores or logs it. nil
	// pulls with the node's own keychain or anonymously.
	RegistryAuth image.StaticKeychain
	// Input is the task's input, written to the attempt's IOPath/input
	// (at most MaxInputBytes). Not recorded or logged: a restarted agent
	// needs it no more once the container runs.
	Input []byte `json:"-"`
	// Build makes the attempt one step of an image build (nil for a
	// task). Not recorded: an agent restart loses a build's step, and the
	// build's attempt is retried.
	Build *BuildStep `json:"-"`
}

// BuildStep is what a build step's attempt does differently from a task:
// Args run as they are (the image's entrypoint is not put in front), and
// Capture is handed the overlay's upper directory (the step's changes)
// after the container exited with 0, before the rootfs is unmounted. An
// error from Capture fails the attempt.
type BuildStep struct {
	Capture func(ctx context.Context, upperDir string) error
}

var taskIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$`)

// Validate reports every bad field at once, each named.
func (t Task) Validate() error {
	var errs []error
	if !taskIDRe.MatchString(t.ID) {
		errs = append(errs, fmt.Errorf("task.id: %q must be 1-40 of [A-Za-z0-9_-]", t.ID))
	}
	if t.Attempt < 1 || t.Attempt > 9999 {
		errs = append(errs, fmt.Errorf("task.attempt: %d is not in 1..9999", t.Attempt))
	}
	if strings.TrimSpace(t.Image) == "" {
		errs = append(errs, errors.New("task.image: empty"))
	}
	for i, kv := range t.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("task.env[%d]: %q is not KEY=VALUE", i, kv))
		}
	}
	for host, c := range t.RegistryAuth {
		if host == "" || c.Username == "" && c.IdentityToken == "" && c.RegistryToken == "" {
			errs = append(errs, fmt.Errorf("task.registryAuth[%q]: needs a host and a username or token", host))
		}
	}
	for i, kv := range t.SecretEnv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("task.secretEnv[%d]: not KEY=VALUE", i))
		}
	}
	if t.Cwd != "" && !filepath.IsAbs(t.Cwd) {
		errs = append(errs, fmt.Errorf("task.cwd: %q is not absolute", t.Cwd))
	}
	if t.GPUs < 0 {
		errs = append(errs, fmt.Errorf("task.gpus: %d is negative", t.GPUs))
	} else if len(t.GPUDevices) != t.GPUs {
		errs = append(errs, fmt.Errorf("task.gpuDevices: %d assigned for %d GPUs", len(t.GPUDevices), t.GPUs))
	}
	for i, d := range t.GPUDevices {
		if d == "" || strings.ContainsAny(d, ", ") {
			errs = append(errs, fmt.Errorf("task.gpuDevices[%d]: %q is not an index or UUID", i, d))
		}
	}
	if t.Timeout < 0 {
		errs = append(errs, fmt.Errorf("task.timeout: %v is negative", t.Timeout))
	}
	if len(t.Input) > MaxInputBytes {
		errs = append(errs, fmt.Errorf("task.input: %d bytes, more than %d", len(t.Input), MaxInputBytes))
	}
	if err := t.Security.WithDefaults().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("task.security: %w", err))
	}
	if t.Network != nil {
		if err := t.Network.Validate("task.network"); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errdefs.WithRetry(fmt.Errorf("task %s attempt %d: %w: %w", t.ID, t.Attempt, errdefs.ErrInvalidArgument, errors.Join(errs...)), false)
}

// runID names this attempt on the node: the sandbox task, the image
// cache's task mount and (with the sandbox prefix) the container.
func (t Task) runID() string { return t.ID + "." + strconv.Itoa(t.Attempt) }

// RunID names the attempt on this node: it is the sandbox's task ID, so
// its container is the sandbox's ContainerID(RunID()) and seccomp records
// carry it.
func (t Task) RunID() string { return t.runID() }

// gpuSpec is the sandbox's NVIDIA_VISIBLE_DEVICES-style GPU selection.
func (t Task) gpuSpec() string { return strings.Join(t.GPUDevices, ",") }
