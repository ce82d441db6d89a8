//go:build cgo && linux

package inventory

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// goNVML adapts go-nvml to nvmlLib. go-nvml dlopens libnvidia-ml.so.1 in
// Init and returns ERROR_LIBRARY_NOT_FOUND when it is missing; every other
// call jumps into the library, so [NVML] calls nothing else unless Init
// succeeded.
type goNVML struct {
	lib goNVMLCalls
}

var _ nvmlLib = goNVML{}

// goNVMLCalls is the part of nvml.Interface used here; nvml.New() and
// processNVML implement it.
type goNVMLCalls interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	SystemGetDriverVersion() (string, nvml.Return)
	SystemGetCudaDriverVersion() (int, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

var (
	_ goNVMLCalls = processNVML{}
	_ goNVMLCalls = nvml.New()
)

// newSystemNVML uses go-nvml's process-wide library. Separate nvml.New()
// instances would each load the library and rewrite go-nvml's shared
// versioned-symbol table without a common lock; the process-wide instance
// loads once and counts Init/Shutdown pairs, so concurrent GPUs calls from
// several [NVML] values are safe.
func newSystemNVML() nvmlLib { return goNVML{lib: processNVML{}} }

// processNVML forwards to go-nvml's package-level functions.
type processNVML struct{}

func (processNVML) Init() nvml.Return     { return nvml.Init() }
func (processNVML) Shutdown() nvml.Return { return nvml.Shutdown() }
func (processNVML) SystemGetDriverVersion() (string, nvml.Return) {
	return nvml.SystemGetDriverVersion()
}
func (processNVML) SystemGetCudaDriverVersion() (int, nvml.Return) {
	return nvml.SystemGetCudaDriverVersion()
}
func (processNVML) DeviceGetCount() (int, nvml.Return) { return nvml.DeviceGetCount() }
func (processNVML) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	return nvml.DeviceGetHandleByIndex(i)
}

// nvmlErr turns a go-nvml return code into an error.
func nvmlErr(r nvml.Return) error {
	switch r {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return errNVMLLibraryNotFound
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return errNVMLDriverNotLoaded
	}
	return fmt.Errorf("nvml error %d: %s", int32(r), r.Error())
}

func (g goNVML) Init() error     { return nvmlErr(g.lib.Init()) }
func (g goNVML) Shutdown() error { return nvmlErr(g.lib.Shutdown()) }

func (g goNVML) SystemGetDriverVersion() (string, error) {
	v, r := g.lib.SystemGetDriverVersion()
	return v, nvmlErr(r)
}

func (g goNVML) SystemGetCudaDriverVersion() (int, error) {
	v, r := g.lib.SystemGetCudaDriverVersion()
	return v, nvmlErr(r)
}

func (g goNVML) DeviceGetCount() (int, error) {
	n, r := g.lib.DeviceGetCount()
	return n, nvmlErr(r)
}

func (g goNVML) DeviceGetHandleByIndex(i int) (nvmlDevice, error) {
	d, r := g.lib.DeviceGetHandleByIndex(i)
	if err := nvmlErr(r); err != nil {
		return nil, err
	}
	return goNVMLDevice{d: d}, nil
}

type goNVMLDevice struct {
	d nvml.Device
}

func (d goNVMLDevice) GetUUID() (string, error) {
	v, r := d.d.GetUUID()
	return v, nvmlErr(r)
}

func (d goNVMLDevice) GetName() (string, error) {
	v, r := d.d.GetName()
	return v, nvmlErr(r)
}

func (d goNVMLDevice) GetMemoryTotal() (uint64, error) {
	m, r := d.d.GetMemoryInfo()
	return m.Total, nvmlErr(r)
}
