package sandbox

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
)

// TaskSpec is what one container runs: the image's unpacked root (the image
// cache gives the path), the process, its limits, GPUs and mounts.
type TaskSpec struct {
	// ID names the task; the container ID is derived from it.
	ID     string `json:"id"`
	Rootfs string `json:"rootfs"`
	// RootfsReadonly mounts the root read-only (an overlay upper makes it
	// writable otherwise).
	RootfsReadonly bool     `json:"rootfsReadonly"`
	Args           []string `json:"args"`
	Env            []string `json:"env"`
	// SecretEnv is KEY=VALUE entries added after Env (replacing the same
	// keys): the task's secrets. They reach the container's process and
	// nothing else the sandbox keeps: the bundle on disk holds them only
	// while the runtime creates the container, and they are never logged
	// or put in an error.
	SecretEnv SecretEnv `json:"-"`
	// User is "user[:group]", each a number or a name in the image's
	// /etc/passwd and /etc/group; empty means ImageUser.
	User string `json:"user"`
	// ImageUser is the image config's user; it decides the no-new-privileges
	// exception for non-root images.
	ImageUser string    `json:"imageUser"`
	Cwd       string    `json:"cwd"`
	Hostname  string    `json:"hostname"`
	Resources Resources `json:"resources"`
	// GPUs uses NVIDIA_VISIBLE_DEVICES syntax: "" or "void" (no GPU, no
	// driver), "none" (driver only), "all", or a comma list of indexes and
	// UUIDs.
	GPUs string `json:"gpus"`
	// Mounts are the volumes the task asked for; the sandbox judges them
	// against the host's sensitive paths (worker.volumeMountValidation).
	Mounts []Mount `json:"mounts"`
	// AgentMounts are the bind mounts the agent adds itself (the egress
	// node's resolv.conf, and anything else a hook of the agent provides).
	// They are trusted, not judged by the volume validation, mounted after
	// Mounts (so they win on the same destination), and must never carry
	// anything a task asked for.
	AgentMounts []Mount `json:"agentMounts,omitempty"`
	// NetNSPath is a network namespace to join (the egress package makes
	// it); empty means a fresh namespace with only loopback.
	NetNSPath string `json:"netnsPath"`
	// DockerInDocker marks tasks that run Docker inside.
	DockerInDocker bool `json:"dockerInDocker"`
	// ShmBytes sizes /dev/shm; zero means 64 MiB, or 1 GiB with GPUs.
	ShmBytes int64 `json:"shmBytes"`
}

// minCPUCapMillis is the least hard CPU cap a task gets.
const minCPUCapMillis = 1000

// Resources are the cgroup limits; zero means unlimited.
type Resources struct {
	// CPUMillis is CPU in thousandths of a core (1500 = 1.5 cores): the
	// task's share when cores are contended, and its hard cap, but the cap
	// is never under one core (see minCPUCapMillis).
	CPUMillis   int64 `json:"cpuMillis"`
	MemoryBytes int64 `json:"memoryBytes"`
	Pids        int64 `json:"pids"`
}

// Mount is a bind mount into the container: a task's volume
// (TaskSpec.Mounts) or one of the agent's own (TaskSpec.AgentMounts).
type Mount struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	ReadOnly    bool   `json:"readOnly"`
	// NoExec adds noexec (nosuid and nodev are always there): for a
	// directory the task writes data into, never programs.
	NoExec bool `json:"noExec,omitempty"`
}

var taskIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// Validate reports every bad field at once, each named.
func (t TaskSpec) Validate() error {
	var errs []error
	if !taskIDRe.MatchString(t.ID) {
		errs = append(errs, fmt.Errorf("task.id: %q must be 1-63 of [A-Za-z0-9_.-]", t.ID))
	}
	if !filepath.IsAbs(t.Rootfs) {
		errs = append(errs, fmt.Errorf("task.rootfs: %q is not an absolute path", t.Rootfs))
	}
	if len(t.Args) == 0 {
		errs = append(errs, errors.New("task.args: empty"))
	}
	for i, kv := range t.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("task.env[%d]: %q is not KEY=VALUE", i, kv))
		}
	}
	for i, kv := range t.SecretEnv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("task.secretEnv[%d]: not KEY=VALUE", i))
		}
	}
	for field, u := range map[string]string{"task.user": t.User, "task.imageUser": t.ImageUser} {
		if us, gs, hasGroup := strings.Cut(u, ":"); u != "" && (us == "" || (hasGroup && gs == "")) {
			errs = append(errs, fmt.Errorf("%s: %q has an empty user or group", field, u))
		}
	}
	if t.Cwd != "" && !filepath.IsAbs(t.Cwd) {
		errs = append(errs, fmt.Errorf("task.cwd: %q is not absolute", t.Cwd))
	}
	r := t.Resources
	if r.CPUMillis < 0 || r.MemoryBytes < 0 || r.Pids < 0 {
		errs = append(errs, fmt.Errorf("task.resources: negative limit in %+v", r))
	}
	if r.MemoryBytes != 0 && r.MemoryBytes < 4<<20 {
		errs = append(errs, fmt.Errorf("task.resources.memoryBytes: %d is below 4 MiB", r.MemoryBytes))
	}
	for field, mounts := range map[string][]Mount{"task.mounts": t.Mounts, "task.agentMounts": t.AgentMounts} {
		for i, m := range mounts {
			if !filepath.IsAbs(m.Source) {
				errs = append(errs, fmt.Errorf("%s[%d].source: %q is not absolute", field, i, m.Source))
			}
			if !filepath.IsAbs(m.Destination) || filepath.Clean(m.Destination) == "/" {
				errs = append(errs, fmt.Errorf("%s[%d].destination: %q must be absolute and not /", field, i, m.Destination))
			}
		}
	}
	if t.ShmBytes < 0 {
		errs = append(errs, fmt.Errorf("task.shmBytes: %d is negative", t.ShmBytes))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("task %s: %w: %w", t.ID, errdefs.ErrInvalidArgument, errors.Join(errs...))
}

func (t TaskSpec) effectiveUser() string {
	if t.User != "" {
		return t.User
	}
	return t.ImageUser
}
