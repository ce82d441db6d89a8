package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	mobyseccomp "github.com/moby/profiles/seccomp"
	"golang.org/x/sys/unix"
)

// maxNofile is the hard open-files limit of the machines levers9 supports; a
// spec never asks for more, since runc fails a container whose rlimit is
// above what it may raise to.
const maxNofile = 20000

// Host is what BuildSpec needs to know about the node. DetectHost reads it;
// tests build it by hand so golden specs are the same on every machine.
type Host struct {
	Arch   string                    `json:"arch"` // GOARCH
	Kernel mobyseccomp.KernelVersion `json:"kernel"`
	// CPUs is how many /sys/devices/system/cpu/cpuN exist, for masking each
	// cpu's thermal_throttle.
	CPUs int `json:"cpus"`
	// AppArmorEnabled is /sys/module/apparmor/parameters/enabled == Y.
	AppArmorEnabled bool `json:"appArmorEnabled"`
	// AppArmorProfiles are the loaded profile names.
	AppArmorProfiles []string `json:"appArmorProfiles"`
	// NofileHard is the agent's own hard RLIMIT_NOFILE.
	NofileHard uint64 `json:"nofileHard"`
	// X32 is whether the kernel carries out x32-ABI syscalls (amd64; most
	// distributions build that ABI out or leave it off at boot). Without
	// it the seccomp filter leaves the x32 architecture out.
	X32  bool         `json:"x32"`
	GPUs GPUInventory `json:"gpus"`
}

// DetectHost reads the node's facts. GPU discovery failing is not an error
// for a node without GPUs: gpus may be nil, and a discovery that finds no
// driver returns an empty inventory.
func DetectHost(ctx context.Context, gpus GPUDiscovery) (Host, error) {
	h := Host{Arch: runtime.GOARCH}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return h, fmt.Errorf("detect host: uname: %w", err)
	}
	rel := unix.ByteSliceToString(uts.Release[:])
	if _, err := fmt.Sscanf(rel, "%d.%d", &h.Kernel.Kernel, &h.Kernel.Major); err != nil {
		return h, fmt.Errorf("detect host: kernel release %q: %w", rel, err)
	}
	cpus, _ := filepath.Glob("/sys/devices/system/cpu/cpu[0-9]*")
	h.CPUs = len(cpus)
	if b, err := os.ReadFile("/sys/module/apparmor/parameters/enabled"); err == nil && strings.TrimSpace(string(b)) == "Y" {
		h.AppArmorEnabled = true
		if b, err := os.ReadFile("/sys/kernel/security/apparmor/profiles"); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				// "name (enforce)"
				if name, _, ok := strings.Cut(line, " ("); ok {
					h.AppArmorProfiles = append(h.AppArmorProfiles, name)
				}
			}
		}
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return h, fmt.Errorf("detect host: getrlimit nofile: %w", err)
	}
	h.NofileHard = rl.Max
	h.X32 = kernelRunsX32()
	if gpus != nil {
		inv, err := gpus.Discover(ctx)
		if err != nil {
			return h, fmt.Errorf("detect host: %w", err)
		}
		h.GPUs = inv
	}
	return h, nil
}

// seccompUnfiltered reports whether a /proc/PID/status says "Seccomp: 0";
// false when it cannot be read or says otherwise.
func seccompUnfiltered(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Seccomp:"); ok {
			return strings.TrimSpace(v) == "0"
		}
	}
	return false
}
