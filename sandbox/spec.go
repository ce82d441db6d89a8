package sandbox

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/levers9/levers9/internal/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// AppArmorProfileName is the profile hardened containers get by default
// (Security.AppArmorProfile) where the node has AppArmor enabled and the
// profile loaded; LoadAppArmor loads it from apparmor/levers9-default.
const AppArmorProfileName = "levers9-default"

// defaultCaps are Docker's default 14 capabilities.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// dockerMaskedPaths are Docker's masked paths; hardened adds each cpu's
// thermal_throttle and, without GPUs, /proc/driver/nvidia.
var dockerMaskedPaths = []string{
	"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
	"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
	"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
}

var dockerReadonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// Effective is what was really applied to a container, which can be less
// than what was asked: runsc ignores masked and read-only paths and
// AppArmor, and cannot take a seccomp log action. It is read from the final
// spec (effectiveOf), never from the request; tasks report this.
type Effective struct {
	Runtime RuntimeName `json:"runtime"`
	// RuntimeVersion is the runtime binary's version line (Sandbox.Run
	// fills it; BuildSpec cannot know it).
	RuntimeVersion string      `json:"runtimeVersion,omitempty"`
	Profile        Profile     `json:"profile"`
	Seccomp        SeccompMode `json:"seccomp"`
	// SeccompSHA256 is the hex sha256 of the seccomp profile's JSON as
	// written to the bundle (its linux.seccomp value); empty when off.
	SeccompSHA256   string `json:"seccompSHA256,omitempty"`
	DropNetRaw      bool   `json:"dropNetRaw"`
	NoNewPrivileges bool   `json:"noNewPrivileges"`
	// MaskedPaths and ReadonlyPaths say whether Masked and Readonly, the
	// paths the runtime enforces, are non-empty; PathsNote says why there
	// are none when the spec had some (runsc).
	MaskedPaths   bool     `json:"maskedPaths"`
	ReadonlyPaths bool     `json:"readonlyPaths"`
	Masked        []string `json:"masked,omitempty"`
	Readonly      []string `json:"readonly,omitempty"`
	PathsNote     string   `json:"pathsNote,omitempty"`
	// AppArmorProfile confines the container; when empty, AppArmorNote
	// says why (AppArmorNotLoaded, AppArmorIgnoredRunsc, AppArmorNotAsked).
	AppArmorProfile string   `json:"appArmorProfile,omitempty"`
	AppArmorNote    string   `json:"appArmorNote,omitempty"`
	Capabilities    []string `json:"capabilities"`
	GPUs            []string `json:"gpus,omitempty"`
	// EgressMode is the network the container was attached to: the
	// caller that attached it fills it (taskrun, from the egress node);
	// BuildSpec sets "none" for a container given its own namespace with
	// only loopback.
	EgressMode string `json:"egressMode,omitempty"`
	// Notes say why something differs from the request.
	Notes []string `json:"notes,omitempty"`
}

// EgressNone is Effective.EgressMode for a container in a fresh network
// namespace holding only loopback.
const EgressNone = "none"

const (
	defaultShm = 64 << 20
	gpuShm     = 1 << 30
)

// BuildSpec turns a task and its (already tightened) security settings into
// an OCI runtime spec for host, and says what of it the chosen runtime will
// really enforce. Capabilities are decided first, and seccomp is resolved
// against them, as Docker does. The steps, in order:
//
//	resolveSpecInputs  validate; task and image users; GPUs
//	capabilitiesFor    bounding set, and effective only for root
//	baseSpec           process, namespaces, sysctls
//	setResources       CPU, memory and pids limits
//	mountsFor          /proc, /dev, /sys, ..., then the task's volumes
//	addGPUs            device nodes, cgroup rules, driver libraries
//	harden             masked and read-only paths, noNewPrivileges, AppArmor
//	applySeccomp       the profile for mode, capabilities and GPUs
//	effectiveOf        what the runtime will enforce, read from the spec
func BuildSpec(task TaskSpec, sec Security, host Host) (*specs.Spec, Effective, error) {
	in, err := resolveSpecInputs(task, sec, host)
	if err != nil {
		return nil, Effective{}, err
	}
	hardened := sec.Profile == ProfileHardened
	var notes []string

	caps, pcaps := capabilitiesFor(sec, in.uid)
	s := baseSpec(task, sec, host, in, pcaps)
	setResources(s.Linux.Resources, task.Resources)
	s.Mounts = mountsFor(task, hardened, in.driver)
	if in.driver {
		addGPUs(s, in.gpus, host.GPUs)
	}
	if hardened {
		notes = append(notes, harden(s, task, sec, host, in)...)
	}
	seccompNote, err := applySeccomp(s, sec, caps, in.driver, host)
	if err != nil {
		return nil, Effective{}, fmt.Errorf("task %s: %w", task.ID, err)
	}
	eff, err := effectiveOf(s, sec.Runtime, sec.Profile, host)
	if err != nil {
		return nil, Effective{}, fmt.Errorf("task %s: %w", task.ID, err)
	}
	if in.driver {
		for _, g := range in.gpus {
			eff.GPUs = append(eff.GPUs, g.UUID)
		}
	}
	if task.NetNSPath == "" {
		eff.EgressMode = EgressNone
	}
	eff.Notes = append(notes, seccompNote...)
	return s, eff, nil
}

// specInputs is what BuildSpec resolves from the task and the host before
// it builds anything.
type specInputs struct {
	uid, gid uint32 // the task's user in its rootfs
	imageUID uint32 // the image's own user
	gpus     []GPU
	driver   bool // the task gets GPUs and the driver's files
}

// resolveSpecInputs validates the settings and the task and resolves its
// users and GPUs; its errors name the field.
func resolveSpecInputs(task TaskSpec, sec Security, host Host) (specInputs, error) {
	var in specInputs
	if err := sec.Validate(); err != nil {
		return in, err
	}
	if err := task.Validate(); err != nil {
		return in, err
	}
	var err error
	if in.uid, in.gid, err = resolveUser(task.Rootfs, task.effectiveUser()); err != nil {
		return in, fmt.Errorf("task %s: task.user: %w: %w", task.ID, err, errdefs.ErrInvalidArgument)
	}
	if in.imageUID, _, err = resolveUser(task.Rootfs, task.ImageUser); err != nil {
		return in, fmt.Errorf("task %s: task.imageUser: %w: %w", task.ID, err, errdefs.ErrInvalidArgument)
	}
	if in.gpus, in.driver, err = selectGPUs(task.GPUs, host.GPUs); err != nil {
		return in, fmt.Errorf("task %s: %w", task.ID, err)
	}
	return in, nil
}

// capabilitiesFor returns the bounding set (Docker's defaults, less
// CAP_NET_RAW when asked) and the process capabilities for uid.
func capabilitiesFor(sec Security, uid uint32) ([]string, *specs.LinuxCapabilities) {
	caps := slices.Clone(defaultCaps)
	if sec.DropNetRaw {
		caps = slices.DeleteFunc(caps, func(c string) bool { return c == "CAP_NET_RAW" })
	}
	pcaps := &specs.LinuxCapabilities{Bounding: caps}
	if uid == 0 {
		// Inheritable stays empty (CVE-2022-24769); a non-root process
		// gets no effective capabilities at all, only the bounding set.
		pcaps.Effective, pcaps.Permitted = slices.Clone(caps), slices.Clone(caps)
	}
	return caps, pcaps
}

// baseSpec is the spec's process (args, env, cwd, user, capabilities,
// nofile limit), root, namespaces, deny-all device rule and sysctls.
func baseSpec(task TaskSpec, sec Security, host Host, in specInputs, pcaps *specs.LinuxCapabilities) *specs.Spec {
	nofile := uint64(maxNofile)
	if host.NofileHard != 0 && host.NofileHard < nofile {
		nofile = host.NofileHard
	}
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, task.Env...)
	cwd := task.Cwd
	if cwd == "" {
		cwd = "/"
	}
	s := &specs.Spec{
		Version:  specs.Version,
		Hostname: task.Hostname,
		Root:     &specs.Root{Path: task.Rootfs, Readonly: task.RootfsReadonly},
		Process: &specs.Process{
			Args:         slices.Clone(task.Args),
			Env:          env,
			Cwd:          cwd,
			User:         specs.User{UID: in.uid, GID: in.gid},
			Capabilities: pcaps,
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: min(1024, nofile)},
			},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace, Path: task.NetNSPath},
			},
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			},
			Sysctl: map[string]string{
				// Both are per network namespace. Binding low ports as
				// non-root without CAP_NET_BIND_SERVICE, like Docker.
				"net.ipv4.ip_unprivileged_port_start": "0",
			},
		},
	}
	if sec.DropNetRaw {
		// Datagram ICMP keeps ping working without raw sockets.
		s.Linux.Sysctl["net.ipv4.ping_group_range"] = "0 2147483647"
	}
	return s
}

// setResources sets the cgroup limits the task asks for.
func setResources(lr *specs.LinuxResources, r Resources) {
	if r.CPUMillis > 0 {
		// The request is the task's share under contention (1024
		// shares per core); the hard cap is the request but never
		// under one core, because a sub-core quota throttles the
		// container's own start (runc init, the dynamic loader) by
		// hundreds of milliseconds.
		period := uint64(100000)
		quota := max(r.CPUMillis, minCPUCapMillis) * 100
		shares := uint64(max(r.CPUMillis*1024/1000, 2))
		lr.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota, Shares: &shares}
	}
	if r.MemoryBytes > 0 {
		m := r.MemoryBytes
		lr.Memory = &specs.LinuxMemory{Limit: &m, Swap: &m}
	}
	if r.Pids > 0 {
		p := r.Pids
		lr.Pids = &specs.LinuxPids{Limit: &p}
	}
}

// mountsFor is the container's filesystem mounts: Docker's defaults (with
// /sys read-only and a read-only cgroup mount when hardened, a larger
// /dev/shm for GPU tasks), then the task's volumes, always nosuid,nodev.
func mountsFor(task TaskSpec, hardened, driver bool) []specs.Mount {
	shm := task.ShmBytes
	if shm == 0 {
		shm = defaultShm
		if driver {
			shm = gpuShm
		}
	}
	sysOpts := []string{"nosuid", "noexec", "nodev"}
	if hardened {
		sysOpts = append(sysOpts, "ro")
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=" + strconv.FormatInt(shm, 10)}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: sysOpts},
	}
	if hardened {
		mounts = append(mounts, specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}})
	}
	for _, m := range slices.Concat(task.Mounts, task.AgentMounts) {
		// nosuid,nodev are forced: a volume must never carry a setuid
		// binary or a device node into the container.
		opts := []string{"rbind", "nosuid", "nodev", "rprivate"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		if m.NoExec {
			opts = append(opts, "noexec")
		}
		mounts = append(mounts, specs.Mount{Destination: filepath.Clean(m.Destination), Type: "bind", Source: m.Source, Options: opts})
	}
	return mounts
}

// harden applies the hardened profile: masked and read-only paths,
// noNewPrivileges unless an allowed exception applies, and the AppArmor
// profile where the node has it. It returns notes on what it left out.
func harden(s *specs.Spec, task TaskSpec, sec Security, host Host, in specInputs) (notes []string) {
	masked := slices.Clone(dockerMaskedPaths)
	for i := 0; i < host.CPUs; i++ {
		masked = append(masked, fmt.Sprintf("/sys/devices/system/cpu/cpu%d/thermal_throttle", i))
	}
	if !in.driver {
		masked = append(masked, "/proc/driver/nvidia")
	}
	s.Linux.MaskedPaths = masked
	s.Linux.ReadonlyPaths = slices.Clone(dockerReadonlyPaths)
	imageNonRoot := task.ImageUser != "" && in.imageUID != 0
	switch {
	case task.DockerInDocker && !sec.NoNewPrivilegesExceptions.DenyDockerInDocker:
		notes = append(notes, "noNewPrivileges not set: task runs Docker inside")
	case imageNonRoot && !sec.NoNewPrivilegesExceptions.DenyNonRootImageUser:
		notes = append(notes, "noNewPrivileges not set: image user is not root")
	default:
		s.Process.NoNewPrivileges = true
	}
	if p := sec.appArmorProfile(); host.AppArmorEnabled && slices.Contains(host.AppArmorProfiles, p) {
		s.Process.ApparmorProfile = p
	}
	return notes
}

// applySeccomp installs the seccomp profile for the asked mode, resolved
// against the bounding capabilities, and notes a mode it could not apply.
func applySeccomp(s *specs.Spec, sec Security, caps []string, driver bool, host Host) (notes []string, err error) {
	mode := sec.Seccomp
	if sec.Runtime == RuntimeRunsc && mode == SeccompLog {
		// gVisor's in-sandbox seccomp has no log action; installing
		// enforce instead could break a pool that only asked to observe.
		mode = SeccompOff
		notes = append(notes, "seccomp log not applied: runsc has no log action")
	}
	sc, err := seccompFor(mode, caps, driver, host)
	if err != nil {
		return nil, err
	}
	s.Linux.Seccomp = sc
	return notes, nil
}

func addGPUs(s *specs.Spec, gpus []GPU, inv GPUInventory) {
	nodes := slices.Clone(inv.Control)
	var uuids []string
	for _, g := range gpus {
		nodes = append(nodes, g.Node)
		uuids = append(uuids, g.UUID)
	}
	mode := os0666
	zero := uint32(0)
	for _, n := range nodes {
		s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: n.Path, Type: "c", Major: n.Major, Minor: n.Minor, FileMode: &mode, UID: &zero, GID: &zero})
		maj, mnr := n.Major, n.Minor
		s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &maj, Minor: &mnr, Access: "rwm"})
	}
	for _, lib := range inv.Libraries {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: lib.Destination, Type: "bind", Source: lib.Source, Options: []string{"rbind", "ro", "nosuid", "nodev", "rprivate"}})
	}
	vis := "none"
	if len(uuids) > 0 {
		vis = joinComma(uuids)
	}
	s.Process.Env = append(s.Process.Env, "NVIDIA_VISIBLE_DEVICES="+vis)
}
