//go:build cgo && linux

package inventory

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// goNVML adapts go-nvml to nvmlLib. go-nvml dlopens libnvidia-ml.so.1 in
// Init and returns ERROR_LIBRARY_NOT_FOUND when it is missing; every other
// call jumps into the library, so GPUs calls nothing else unless Init
// succeeded.
type goNVML struct {
	lib nvml.Interface
}

var _ nvmlLib = goNVML{}

// newSystemNVML uses a library instance of its own rather than go-nvml's
// package-level one, so its refcount is not shared with other users.
func newSystemNVML() nvmlLib { return goNVML{lib: nvml.New()} }

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
