//go:build cgo && linux

package inventory

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestNVMLErrMapping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   nvml.Return
		is   error  // sentinel the result must wrap, if any
		want string // substring of the message otherwise
	}{
		{in: nvml.ERROR_LIBRARY_NOT_FOUND, is: errNVMLLibraryNotFound},
		{in: nvml.ERROR_DRIVER_NOT_LOADED, is: errNVMLDriverNotLoaded},
		{in: nvml.ERROR_NO_PERMISSION, want: "nvml error 4: "},
		{in: nvml.ERROR_GPU_IS_LOST, want: "nvml error 15: "},
	}
	if err := nvmlErr(nvml.SUCCESS); err != nil {
		t.Errorf("nvmlErr(SUCCESS) = %v", err)
	}
	for _, tt := range tests {
		err := nvmlErr(tt.in)
		switch {
		case err == nil:
			t.Errorf("nvmlErr(%d) = nil", tt.in)
		case tt.is != nil && !errors.Is(err, tt.is):
			t.Errorf("nvmlErr(%d) = %v, want %v", tt.in, err, tt.is)
		case tt.is == nil && !strings.Contains(err.Error(), tt.want):
			t.Errorf("nvmlErr(%d) = %v, want it to contain %q", tt.in, err, tt.want)
		}
	}
}

// TestGoNVMLWithoutLibrary checks go-nvml's own behaviour that NVML relies
// on: with no libnvidia-ml.so.1, Init reports ERROR_LIBRARY_NOT_FOUND rather
// than panicking, and Shutdown of a never-initialised library is refused
// rather than calling into the missing library.
func TestGoNVMLWithoutLibrary(t *testing.T) {
	t.Parallel()
	lib := goNVML{lib: nvml.New(nvml.WithLibraryPath("/nonexistent/l9v/libnvidia-ml.so.1"))}
	if err := lib.Init(); !errors.Is(err, errNVMLLibraryNotFound) {
		t.Fatalf("Init = %v, want %v", err, errNVMLLibraryNotFound)
	}
	if err := lib.Shutdown(); err == nil {
		t.Fatal("Shutdown after a failed Init succeeded")
	}
}
