package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/testenv"
)

// fakeNVIDIAHost lays out what the driver shows on a two-GPU machine under
// root: /proc/driver/nvidia/gpus/*/information, real character device
// nodes and driver libraries. Only this listing is fake; discovery, spec
// and cgroup rules run for real.
func fakeNVIDIAHost(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	root := t.TempDir()
	write := func(p, s string) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/driver/nvidia/gpus/0000:3b:00.0/information", "Model: \t\t NVIDIA A100\nIRQ:   \t\t 42\nGPU UUID: \t\t GPU-11111111-aaaa\nDevice Minor: \t\t 0\n")
	write("proc/driver/nvidia/gpus/0000:af:00.0/information", "Model: \t\t NVIDIA A100\nGPU UUID: \t\t GPU-22222222-bbbb\nDevice Minor: \t\t 3\n")
	write("usr/lib/x86_64-linux-gnu/libcuda.so.550.54", "")
	write("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54", "")
	write("usr/lib/x86_64-linux-gnu/libc.so.6", "")
	for name, dev := range map[string][2]uint32{"nvidia0": {195, 0}, "nvidia3": {195, 3}, "nvidiactl": {195, 255}, "nvidia-uvm": {508, 0}} {
		p := filepath.Join(root, "dev", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(dev[0], dev[1]))); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestNVIDIADiscoveryToSpec(t *testing.T) {
	root := fakeNVIDIAHost(t)
	inv, err := NVIDIADiscovery{Root: root}.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 2 || inv.GPUs[1].UUID != "GPU-22222222-bbbb" || inv.GPUs[1].Node != (DeviceNode{Path: "/dev/nvidia3", Major: 195, Minor: 3}) {
		t.Fatalf("gpus %+v", inv.GPUs)
	}
	if len(inv.Control) != 2 {
		t.Errorf("control nodes %+v", inv.Control)
	}
	wantLibs := []HostFile{
		{Source: root + "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54", Destination: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54"},
		{Source: root + "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54", Destination: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54"},
	}
	if !slices.Equal(inv.Libraries, wantLibs) {
		t.Errorf("libraries %v", inv.Libraries)
	}

	h := goldenHost()
	h.GPUs = inv
	task := goldenTask()
	task.GPUs = "1"
	s, eff, err := BuildSpec(task, Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: RuntimeRunc}, h)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(eff.GPUs, []string{"GPU-22222222-bbbb"}) {
		t.Errorf("effective gpus %v", eff.GPUs)
	}
	var allowed []string
	for _, r := range s.Linux.Resources.Devices {
		if r.Allow {
			allowed = append(allowed, devRule(r))
		}
	}
	want := []string{"c 195:255 rwm", "c 508:0 rwm", "c 195:3 rwm"}
	if !slices.Equal(allowed, want) {
		t.Errorf("device cgroup allows %v, want %v", allowed, want)
	}
	if s.Linux.Resources.Devices[0].Allow {
		t.Error("device cgroup does not start with deny-all")
	}
	if slices.Contains(s.Linux.MaskedPaths, "/proc/driver/nvidia") {
		t.Error("/proc/driver/nvidia masked for a GPU task")
	}
	if !slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool {
		return m.Destination == "/dev/shm" && slices.Contains(m.Options, "size=1073741824")
	}) {
		t.Error("GPU task /dev/shm is not 1 GiB")
	}

	// A host without the driver degrades to no GPUs.
	empty, err := NVIDIADiscovery{Root: t.TempDir()}.Discover(context.Background())
	if err != nil || len(empty.GPUs)+len(empty.Control)+len(empty.Libraries) != 0 {
		t.Errorf("no driver: %+v %v", empty, err)
	}
}

func devRule(r specs.LinuxDeviceCgroup) string {
	return r.Type + " " + strconv.FormatInt(*r.Major, 10) + ":" + strconv.FormatInt(*r.Minor, 10) + " " + r.Access
}

// TestGPUContainerUpToDevice runs a real container with the fake host's
// second GPU: its node, the control nodes and the driver libraries are
// there, the other GPU is not, and opening the node reaches the device
// (which, without a driver, answers ENXIO rather than the cgroup's EPERM).
func TestGPUContainerUpToDevice(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc")
	root := fakeNVIDIAHost(t)
	inv, err := NVIDIADiscovery{Root: root}.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b := setupSandbox(t)
	host := b.host
	host.GPUs = inv
	sb, err := New(Config{StateDir: "/run/l9s-test", CgroupParent: "/l9s-test", Host: host})
	if err != nil {
		t.Fatal(err)
	}
	rootfs := makeRootfs(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out testenv.SyncBuffer
	script := `busybox ls /dev; echo VIS=$NVIDIA_VISIBLE_DEVICES; busybox ls /usr/lib/x86_64-linux-gnu; cat /dev/nvidia3; cat /dev/nvidia0; busybox df /dev/shm`
	task := TaskSpec{ID: "gpu", Rootfs: rootfs, Args: []string{"sh", "-c", script}, GPUs: "GPU-22222222-bbbb"}
	h, err := sb.Run(ctx, task, Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: RuntimeRunc}, Stdio{Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Delete(context.Background()) })
	if _, err := h.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"nvidia3", "nvidiactl", "nvidia-uvm", "VIS=GPU-22222222-bbbb", "libcuda.so.550.54", "libnvidia-ml.so.550.54",
		"nvidia3': No such device or address", "nvidia0': No such file", "1048576"} {
		if !strings.Contains(got, want) {
			t.Errorf("container output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "libc.so.6") {
		t.Errorf("non-driver library mounted:\n%s", got)
	}
}
