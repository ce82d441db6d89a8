package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
	"golang.org/x/sys/unix"
)

// GPUDiscovery lists the host's NVIDIA devices and driver files. It is the
// one seam tests replace (there is no GPU on CI); everything after it (device
// nodes, cgroup rules, mounts, seccomp) is the real path. Discover may block
// on the filesystem, is safe to call concurrently, and returns an empty
// inventory (not an error) on a host without the driver.
type GPUDiscovery interface {
	Discover(ctx context.Context) (GPUInventory, error)
}

// DeviceNode is a character device on the host.
type DeviceNode struct {
	Path  string `json:"path"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
}

// GPU is one NVIDIA GPU: its index (as nvidia-smi counts), UUID and node.
type GPU struct {
	Index int        `json:"index"`
	UUID  string     `json:"uuid"`
	Node  DeviceNode `json:"node"`
}

// GPUInventory is what the host offers: GPUs, the control nodes every GPU
// container needs (nvidiactl, nvidia-uvm, ...), and driver libraries.
type GPUInventory struct {
	GPUs      []GPU        `json:"gpus"`
	Control   []DeviceNode `json:"control"`
	Libraries []HostFile   `json:"libraries"`
}

// HostFile is a host file bind-mounted read-only at Destination.
type HostFile struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// NVIDIADiscovery reads the driver's view of the host under Root ("/" in
// production): Root/proc/driver/nvidia/gpus/*/information for index, UUID
// and minor, Root/dev for the nodes, and the library directories for
// libcuda and libnvidia-*. Paths it reports are relative to Root made
// absolute, i.e. what the container sees.
type NVIDIADiscovery struct {
	Root string
	// LibDirs default to the Debian/Ubuntu and RHEL locations.
	LibDirs []string
}

var _ GPUDiscovery = NVIDIADiscovery{}

// Discover implements GPUDiscovery.
func (d NVIDIADiscovery) Discover(ctx context.Context) (GPUInventory, error) {
	root := d.Root
	if root == "" {
		root = "/"
	}
	var inv GPUInventory
	infos, _ := filepath.Glob(filepath.Join(root, "proc/driver/nvidia/gpus/*/information"))
	if len(infos) == 0 {
		return inv, nil
	}
	var gpus []gpuInfo
	for _, p := range infos {
		if err := ctx.Err(); err != nil {
			return inv, err
		}
		f, err := parseGPUInformation(p)
		if err != nil {
			return inv, err
		}
		gpus = append(gpus, f)
	}
	// nvidia-smi's index follows the PCI bus order, which is the order of
	// the directory names (bus ids) the glob returns sorted.
	for i, g := range gpus {
		node, err := statNode(root, fmt.Sprintf("/dev/nvidia%d", g.minor))
		if err != nil {
			return inv, err
		}
		inv.GPUs = append(inv.GPUs, GPU{Index: i, UUID: g.uuid, Node: node})
	}
	for _, name := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} {
		node, err := statNode(root, name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return inv, err
		}
		inv.Control = append(inv.Control, node)
	}
	dirs := d.LibDirs
	if len(dirs) == 0 {
		dirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu"}
	}
	for _, dir := range dirs {
		for _, pat := range []string{"libcuda.so*", "libnvidia-*.so*", "libnvcuvid.so*"} {
			m, _ := filepath.Glob(filepath.Join(root, dir, pat))
			for _, p := range m {
				inv.Libraries = append(inv.Libraries, HostFile{Source: p, Destination: filepath.Join("/", strings.TrimPrefix(p, root))})
			}
		}
	}
	sort.Slice(inv.Libraries, func(i, j int) bool { return inv.Libraries[i].Destination < inv.Libraries[j].Destination })
	return inv, nil
}

type gpuInfo struct {
	uuid  string
	minor int64
}

func parseGPUInformation(path string) (gpuInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return gpuInfo{}, fmt.Errorf("gpu discovery: %w", err)
	}
	defer f.Close()
	info := gpuInfo{minor: -1}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "GPU UUID":
			info.uuid = v
		case "Device Minor":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return info, fmt.Errorf("gpu discovery: %s: Device Minor %q: %w", path, v, err)
			}
			info.minor = n
		}
	}
	if info.uuid == "" || info.minor < 0 {
		return info, fmt.Errorf("gpu discovery: %s: missing GPU UUID or Device Minor", path)
	}
	return info, sc.Err()
}

func statNode(root, name string) (DeviceNode, error) {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(root, name), &st); err != nil {
		return DeviceNode{}, fmt.Errorf("gpu discovery: stat %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return DeviceNode{}, fmt.Errorf("gpu discovery: %s is not a character device", name)
	}
	return DeviceNode{Path: name, Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev))}, nil
}

// selectGPUs applies NVIDIA_VISIBLE_DEVICES semantics: ""/"void" means no
// GPU and no driver (ok=false); "none" means the driver without GPUs; "all"
// every GPU; otherwise a comma list of indexes or UUIDs, each of which must
// exist.
func selectGPUs(req string, inv GPUInventory) (gpus []GPU, driver bool, err error) {
	switch strings.TrimSpace(req) {
	case "", "void":
		return nil, false, nil
	case "none":
		return nil, true, nil
	case "all":
		if len(inv.GPUs) == 0 {
			return nil, false, fmt.Errorf("task.gpus: \"all\" but the host has no GPUs: %w", errdefs.ErrFailedPrecondition)
		}
		return inv.GPUs, true, nil
	}
	seen := map[string]bool{}
	for i, want := range strings.Split(req, ",") {
		want = strings.TrimSpace(want)
		var hit *GPU
		for j := range inv.GPUs {
			g := &inv.GPUs[j]
			if want == strconv.Itoa(g.Index) || want == g.UUID {
				hit = g
				break
			}
		}
		if hit == nil {
			return nil, false, fmt.Errorf("task.gpus[%d]: %q is not a GPU on this host: %w", i, want, errdefs.ErrFailedPrecondition)
		}
		if !seen[hit.UUID] {
			seen[hit.UUID] = true
			gpus = append(gpus, *hit)
		}
	}
	return gpus, true, nil
}

const os0666 = fs.FileMode(0o666)

func joinComma(s []string) string { return strings.Join(s, ",") }
