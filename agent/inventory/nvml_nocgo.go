//go:build !(cgo && linux)

package inventory

// noNVML stands in for go-nvml, which needs cgo: Init always reports that
// NVML is unavailable, so [NVML] lists no GPUs.
type noNVML struct{}

var _ nvmlLib = noNVML{}

func newSystemNVML() nvmlLib { return noNVML{} }

func (noNVML) Init() error                                    { return errNVMLNotBuilt }
func (noNVML) Shutdown() error                                { return nil }
func (noNVML) SystemGetDriverVersion() (string, error)        { return "", errNVMLNotBuilt }
func (noNVML) SystemGetCudaDriverVersion() (int, error)       { return 0, errNVMLNotBuilt }
func (noNVML) DeviceGetCount() (int, error)                   { return 0, errNVMLNotBuilt }
func (noNVML) DeviceGetHandleByIndex(int) (nvmlDevice, error) { return nil, errNVMLNotBuilt }
