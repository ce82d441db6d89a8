package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
)

// nvmlLib is the part of NVML that [NVML] uses, shaped after go-nvml's
// calls but returning Go errors, so that the mapping code compiles without
// cgo and tests can stand in a fake library. Implementations: nvml_cgo.go
// (go-nvml) and nvml_nocgo.go (always "not built").
type nvmlLib interface {
	// Init loads and initialises the library. It returns an error wrapping
	// one of the errNVML* sentinels when there is no usable driver.
	Init() error
	// Shutdown undoes one successful Init.
	Shutdown() error
	SystemGetDriverVersion() (string, error)
	// SystemGetCudaDriverVersion returns 1000*major + 10*minor.
	SystemGetCudaDriverVersion() (int, error)
	DeviceGetCount() (int, error)
	DeviceGetHandleByIndex(index int) (nvmlDevice, error)
}

// nvmlDevice is the part of go-nvml's Device that [NVML] uses.
type nvmlDevice interface {
	GetUUID() (string, error)
	GetName() (string, error)
	// GetMemoryTotal returns the total framebuffer memory in bytes.
	GetMemoryTotal() (uint64, error)
}

// Reasons for Init to fail that mean "this machine has no NVIDIA GPU to
// offer" rather than "something is broken".
var (
	errNVMLLibraryNotFound = errors.New("libnvidia-ml.so.1 not found")
	errNVMLDriverNotLoaded = errors.New("NVIDIA driver not loaded")
	errNVMLNotBuilt        = errors.New("agent built without cgo, NVML unavailable")
)

// NVML is the [GPULister] backed by NVIDIA's management library. Each call
// initialises NVML, reads the devices and shuts it down again, so a driver
// installed or upgraded while the agent runs is picked up by the next call.
//
// Heartbeats call GPUs periodically; on a machine without a driver only the
// first call logs (one debug line), so the absence stays silent afterwards.
type NVML struct {
	lib    nvmlLib
	logger *slog.Logger
	// loggedAbsent is set once the "no NVIDIA GPUs" line has been logged.
	loggedAbsent atomic.Bool
}

var _ GPULister = (*NVML)(nil)

// NewNVML returns the NVML lister. It does not load the library yet.
func NewNVML(logger *slog.Logger) *NVML {
	return newNVMLWith(newSystemNVML(), logger)
}

func newNVMLWith(lib nvmlLib, logger *slog.Logger) *NVML {
	if logger == nil {
		logger = slog.Default()
	}
	return &NVML{lib: lib, logger: logger}
}

// GPUs implements [GPULister]. With no NVIDIA library or driver it returns
// no GPUs and no error, and logs at debug level on the first such call only.
func (n *NVML) GPUs(ctx context.Context) ([]GPU, error) {
	if err := n.lib.Init(); err != nil {
		if errors.Is(err, errNVMLLibraryNotFound) || errors.Is(err, errNVMLDriverNotLoaded) || errors.Is(err, errNVMLNotBuilt) {
			if !n.loggedAbsent.Swap(true) {
				n.logger.DebugContext(ctx, "no NVIDIA GPUs", "reason", err.Error())
			}
			return nil, nil
		}
		return nil, fmt.Errorf("nvml init: %w", err)
	}
	defer func() {
		if err := n.lib.Shutdown(); err != nil {
			// The devices were read; a failed shutdown only leaks a refcount.
			n.logger.WarnContext(ctx, "nvml shutdown failed", "error", err.Error())
		}
	}()

	driver, err := n.lib.SystemGetDriverVersion()
	if err != nil {
		return nil, fmt.Errorf("nvml driver version: %w", err)
	}
	cudaRaw, err := n.lib.SystemGetCudaDriverVersion()
	if err != nil {
		return nil, fmt.Errorf("nvml cuda driver version: %w", err)
	}
	cuda := formatCUDAVersion(cudaRaw)
	count, err := n.lib.DeviceGetCount()
	if err != nil {
		return nil, fmt.Errorf("nvml device count: %w", err)
	}

	var (
		gpus []GPU
		errs []error
	)
	for i := range count {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		g, err := n.device(i)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		g.DriverVersion, g.CUDADriverVersion = driver, cuda
		gpus = append(gpus, g)
	}
	return gpus, errors.Join(errs...)
}

// device reads GPU i; errors name the index and the failed query.
func (n *NVML) device(i int) (GPU, error) {
	d, err := n.lib.DeviceGetHandleByIndex(i)
	if err != nil {
		return GPU{}, fmt.Errorf("nvml gpu %d: handle: %w", i, err)
	}
	g := GPU{Index: i}
	if g.UUID, err = d.GetUUID(); err != nil {
		return GPU{}, fmt.Errorf("nvml gpu %d: uuid: %w", i, err)
	}
	if g.Name, err = d.GetName(); err != nil {
		return GPU{}, fmt.Errorf("nvml gpu %d (%s): name: %w", i, g.UUID, err)
	}
	if g.MemoryTotalBytes, err = d.GetMemoryTotal(); err != nil {
		return GPU{}, fmt.Errorf("nvml gpu %d (%s): memory: %w", i, g.UUID, err)
	}
	return g, nil
}

// formatCUDAVersion turns NVML's 1000*major+10*minor (12040) into "12.4";
// 0 or less (no CUDA support reported) gives "".
func formatCUDAVersion(v int) string {
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
}
