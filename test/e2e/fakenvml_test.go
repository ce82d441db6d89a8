package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/testenv"
)

// fakeNVMLSource is a libnvidia-ml.so.1 reporting GPUS GPUs named "NVIDIA
// L40S" with UUIDs GPU-l9kp-N: the symbols go-nvml resolves for what the
// agent's inventory asks (agent/inventory/nvml.go), v1 and v2 names.
const fakeNVMLSource = `
#include <stdio.h>
#include <string.h>
#include <stdint.h>
typedef struct { unsigned long long total, free, used; } mem_t;
static int count(void) { return GPUS; }
int nvmlInit(void) { return 0; }
int nvmlInit_v2(void) { return 0; }
int nvmlInitWithFlags(unsigned int f) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return "fake nvml error"; }
int nvmlSystemGetDriverVersion(char *v, unsigned int n) { snprintf(v, n, "550.54.15"); return 0; }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 12040; return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 12040; return 0; }
int nvmlDeviceGetCount(unsigned int *n) { *n = count(); return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = count(); return 0; }
int nvmlDeviceGetHandleByIndex(unsigned int i, void **d) { if (i >= (unsigned)count()) return 2; *d = (void *)(uintptr_t)(i + 1); return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) { return nvmlDeviceGetHandleByIndex(i, d); }
int nvmlDeviceGetUUID(void *d, char *u, unsigned int n) { snprintf(u, n, "GPU-l9kp-%d", (int)((uintptr_t)d - 1)); return 0; }
int nvmlDeviceGetName(void *d, char *s, unsigned int n) { snprintf(s, n, "NVIDIA L40S"); return 0; }
int nvmlDeviceGetMemoryInfo(void *d, mem_t *m) { m->total = 48ULL << 30; m->free = m->total; m->used = 0; return 0; }
`

// fakeGPUNode builds the fake NVML library and a driver root with n GPUs
// (UUIDs GPU-l9kp-N): /proc/driver/nvidia/gpus/*/information and character
// devices /dev/nvidiaN and /dev/nvidiactl (major 195, as the driver's;
// nothing opens them). It returns the library's directory (for
// LD_LIBRARY_PATH) and the root (for levers9-agent run --gpu-root).
func fakeGPUNode(t *testing.T, n int) (libDir, root string) {
	t.Helper()
	// cgo's compiler (packaging/dev/deps.sh installs it).
	testenv.RequireBinary(t, "cc")
	dir := t.TempDir()
	libDir, root = filepath.Join(dir, "lib"), filepath.Join(dir, "root")
	for _, d := range []string{libDir, filepath.Join(root, "dev")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join(dir, "fakenvml.c")
	if err := os.WriteFile(src, []byte(fakeNVMLSource), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cc", "-shared", "-fPIC", fmt.Sprintf("-DGPUS=%d", n), "-o", filepath.Join(libDir, "libnvidia-ml.so.1"), src)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the fake NVML library: %v\n%s", err, out)
	}
	for i := 0; i < n; i++ {
		info := filepath.Join(root, "proc", "driver", "nvidia", "gpus", fmt.Sprintf("0000:%02x:00.0", i+1), "information")
		if err := os.MkdirAll(filepath.Dir(info), 0o755); err != nil {
			t.Fatal(err)
		}
		text := fmt.Sprintf("Model: \t\t NVIDIA L40S\nGPU UUID: \t GPU-l9kp-%d\nDevice Minor: \t %d\n", i, i)
		if err := os.WriteFile(info, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(filepath.Join(root, "dev", fmt.Sprintf("nvidia%d", i)), unix.S_IFCHR|0o666, int(unix.Mkdev(195, uint32(i)))); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mknod(filepath.Join(root, "dev", "nvidiactl"), unix.S_IFCHR|0o666, int(unix.Mkdev(195, 255))); err != nil {
		t.Fatal(err)
	}
	return libDir, root
}
