package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/levers9/levers9/sandbox"
)

// Inventory is what the agent reports about its machine. When
// [Collector.Collect] returns no error, a zero field means "absent" (no runsc
// installed, no GPUs); a fact that could not be read is also left zero, but
// then the error names it.
type Inventory struct {
	Hostname string
	// OS is runtime.GOOS ("linux").
	OS string
	// Arch is runtime.GOARCH ("amd64", "arm64").
	Arch string
	// KernelRelease is uname -r.
	KernelRelease string
	CPU           CPU
	// MemoryTotalBytes is MemTotal from /proc/meminfo.
	MemoryTotalBytes uint64
	Disk             Disk
	// RuncVersion and RunscVersion are the versions the binaries print, ""
	// when the binary is not installed.
	RuncVersion  string
	RunscVersion string
	// AppArmorEnabled is true when the kernel has AppArmor and it is on.
	AppArmorEnabled bool
	// GPUs is empty on a machine without NVIDIA GPUs or driver.
	GPUs []GPU
}

// CPU describes the processors listed in /proc/cpuinfo.
type CPU struct {
	// Count is the number of logical processors.
	Count int
	// Model is the first processor's model name, "" when the kernel does not
	// expose one (some arm64 machines).
	Model string
}

// Disk describes the filesystem holding the agent's state directory.
type Disk struct {
	Path       string
	TotalBytes uint64
	// FreeBytes is the space available to unprivileged users, the part the
	// agent's image cache can count on.
	FreeBytes uint64
}

// GPU is one NVIDIA device as NVML reports it.
type GPU struct {
	// Index is NVML's device index, the number NVIDIA_VISIBLE_DEVICES uses.
	Index int
	// UUID looks like "GPU-5f3c...".
	UUID             string
	Name             string
	MemoryTotalBytes uint64
	DriverVersion    string
	// CUDADriverVersion is the CUDA version the driver supports, "12.4".
	CUDADriverVersion string
}

// Config configures a [Collector]. Only StateDir is required.
type Config struct {
	// StateDir is the agent's state directory; its filesystem is reported as
	// [Inventory.Disk]. It must exist.
	StateDir string
	// GPUs lists the GPUs; default [NewNVML].
	GPUs GPULister
	// Logger receives debug lines only; default slog.Default().
	Logger *slog.Logger
	// RuncPath and RunscPath name the binaries, looked up on PATH when they
	// have no slash; defaults "runc" and "runsc".
	RuncPath  string
	RunscPath string
	// CommandTimeout bounds each `--version` call; default 5s.
	CommandTimeout time.Duration
	// ProcDir and SysDir are the procfs and sysfs mounts; defaults "/proc"
	// and "/sys". Tests point them at fixtures.
	ProcDir string
	SysDir  string
}

// withDefaults returns cfg with every unset field given its default.
func (cfg Config) withDefaults() Config {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.GPUs == nil {
		cfg.GPUs = NewNVML(cfg.Logger)
	}
	if cfg.RuncPath == "" {
		cfg.RuncPath = "runc"
	}
	if cfg.RunscPath == "" {
		cfg.RunscPath = "runsc"
	}
	if cfg.CommandTimeout == 0 {
		cfg.CommandTimeout = 5 * time.Second
	}
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	if cfg.SysDir == "" {
		cfg.SysDir = "/sys"
	}
	return cfg
}

// Validate reports every problem with cfg, each naming its field.
func (cfg Config) Validate() error {
	var errs []error
	if cfg.StateDir == "" {
		errs = append(errs, errors.New("inventory: StateDir: required"))
	} else if !filepath.IsAbs(cfg.StateDir) {
		errs = append(errs, fmt.Errorf("inventory: StateDir: %q is not an absolute path", cfg.StateDir))
	}
	if cfg.CommandTimeout < 0 {
		errs = append(errs, fmt.Errorf("inventory: CommandTimeout: %v is negative", cfg.CommandTimeout))
	}
	return errors.Join(errs...)
}

// Collector gathers an [Inventory]. It holds no mutable state, so Collect
// is safe to call concurrently and as often as heartbeats need.
type Collector struct {
	cfg Config
	// versions remembers each runtime's answer while its binary is the
	// same file: heartbeats collect often, and `runsc --version` costs a
	// noticeable slice of a CPU each time.
	mu       sync.Mutex
	versions map[string]cachedVersion
}

type cachedVersion struct {
	path    string
	size    int64
	mtime   time.Time
	version string
}

// runtimeVersion is sandbox.RuntimeVersion, cached per binary file.
func (c *Collector) runtimeVersion(ctx context.Context, bin, name string) (string, error) {
	path, err := exec.LookPath(bin)
	var st os.FileInfo
	if err == nil {
		st, err = os.Stat(path)
	}
	if err != nil {
		return sandbox.RuntimeVersion(ctx, bin, name, c.cfg.CommandTimeout)
	}
	c.mu.Lock()
	cv, ok := c.versions[name]
	c.mu.Unlock()
	if ok && cv.path == path && cv.size == st.Size() && cv.mtime.Equal(st.ModTime()) {
		return cv.version, nil
	}
	v, err := sandbox.RuntimeVersion(ctx, bin, name, c.cfg.CommandTimeout)
	if err == nil {
		c.mu.Lock()
		c.versions[name] = cachedVersion{path: path, size: st.Size(), mtime: st.ModTime(), version: v}
		c.mu.Unlock()
	}
	return v, err
}

// NewCollector checks cfg and applies its defaults.
func NewCollector(cfg Config) (*Collector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Collector{cfg: cfg.withDefaults(), versions: map[string]cachedVersion{}}, nil
}

// Collect reads the machine's inventory. It blocks for at most about
// 2×(CommandTimeout+1s) plus the GPU query; a runtime's --version runs again
// only when its binary changed. The returned Inventory is always
// usable: a fact that could not be read is left at its zero value, and the
// error joins one entry per such fact, each naming it. A cancelled ctx
// returns ctx.Err() and no inventory.
func (c *Collector) Collect(ctx context.Context) (Inventory, error) {
	inv := Inventory{OS: runtime.GOOS, Arch: runtime.GOARCH}
	var errs []error
	fail := func(field string, err error) {
		errs = append(errs, fmt.Errorf("inventory: %s: %w", field, err))
	}

	var err error
	if inv.Hostname, err = os.Hostname(); err != nil {
		fail("hostname", err)
	}
	if inv.KernelRelease, err = kernelRelease(); err != nil {
		fail("kernel release", err)
	}
	if inv.CPU, err = readCPUInfo(filepath.Join(c.cfg.ProcDir, "cpuinfo")); err != nil {
		fail("cpu", err)
	}
	if inv.MemoryTotalBytes, err = readMemTotal(filepath.Join(c.cfg.ProcDir, "meminfo")); err != nil {
		fail("memory", err)
	}
	if inv.Disk, err = diskUsage(c.cfg.StateDir); err != nil {
		fail("disk", err)
	}
	if inv.AppArmorEnabled, err = appArmorEnabled(c.cfg.SysDir); err != nil {
		fail("apparmor", err)
	}
	if inv.RuncVersion, err = c.runtimeVersion(ctx, c.cfg.RuncPath, "runc"); err != nil {
		fail("runc version", err)
	}
	if inv.RunscVersion, err = c.runtimeVersion(ctx, c.cfg.RunscPath, "runsc"); err != nil {
		fail("runsc version", err)
	}
	if ctx.Err() != nil {
		return Inventory{}, ctx.Err()
	}
	// GPUs may be partial: keep what was read beside the error.
	inv.GPUs, err = c.cfg.GPUs.GPUs(ctx)
	if err != nil {
		fail("gpus", err)
	}
	if ctx.Err() != nil {
		return Inventory{}, ctx.Err()
	}
	return inv, errors.Join(errs...)
}
