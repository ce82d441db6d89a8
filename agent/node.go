package agent

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/levers9/levers9/agent/taskrun"
	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/tunnel"
)

// NodeConfig says how `levers9-agent run` builds the parts that run tasks
// on this machine. Everything the parts create on the host carries Prefix,
// and everything they keep on disk is under StateDir, so two agents on one
// host (each in its own network namespace, with its own state directory)
// never touch each other's containers, cgroups, mounts or bridges.
type NodeConfig struct {
	// StateDir is the agent's state directory; the image cache, container
	// state, network files and attempt records go under it.
	StateDir string
	// MachineID seeds the default Prefix.
	MachineID string
	// Prefix names host objects: containers, cgroups, bridge, network
	// namespaces (1-8 of [a-z0-9], starting with a letter). Default "l9"
	// and 6 hex digits of the machine ID's hash.
	Prefix string
	// ImageRegistry is worker.imageRegistry, the registry references
	// without one resolve against (default index.docker.io); Registries
	// may be named explicitly too; InsecureRegistries (a subset) are
	// reached over plain HTTP.
	ImageRegistry      string
	Registries         []string
	InsecureRegistries []string
	// ImageDiskBudget caps the image cache in bytes (0: no GC).
	ImageDiskBudget int64
	// NoNetwork runs containers with only loopback instead of attaching
	// them to the egress network.
	NoNetwork bool
	// RunscPath is the runsc binary runsc pools run with (default
	// DefaultRunscPath: the pinned gVisor build when installed, else runsc
	// on PATH).
	RunscPath string
	// WeedPath is the SeaweedFS weed binary that mounts seaweedfs volumes
	// (default $LEVERS9_WEED_BIN, else weed on PATH; none refuses tasks
	// with volumes).
	WeedPath string
	// GPURoot is where the NVIDIA driver's /proc/driver/nvidia and /dev
	// nodes are found (default /; the GPU operator's driver container
	// mounts them elsewhere, e.g. /run/nvidia/driver).
	GPURoot string
	// SubnetV4, SubnetV6 and Resolvers configure the container network
	// (defaults: egress's subnets; the host's non-loopback resolvers).
	SubnetV4, SubnetV6 string
	Resolvers          []string
	// NFLOGGroup is the egress chains' netlink log group. Unset, and
	// SubnetV4/SubnetV6 unset, are claimed from the host allocator
	// (egress.ClaimHost), so every agent on a host gets its own.
	NFLOGGroup uint16
	// HostNet configures the host allocator: where claims are kept
	// (default egress.DefaultHostDir) and the subnet pools and NFLOG
	// groups it hands out.
	HostNet egress.HostConfig
	// Controlplane are allow entries containers may always reach.
	Controlplane []string
	// SeccompObserver, when set, is told of every seccomp log-mode record
	// attributed to a task (default: counted in Metrics.SeccompLogEvents).
	SeccompObserver SeccompObserver
	// SeccompFlush is how often an attempt's changed seccomp totals are
	// sent (default DefaultSeccompFlush).
	SeccompFlush time.Duration
	// Metrics takes the egress and image cache metrics (nil: a fresh
	// registry nobody reads).
	Metrics *Metrics
	Logger  *slog.Logger
}

// PinnedRunsc is where `make deps` (packaging/dev/runsc.sh) installs the
// gVisor runsc that levers9 pins. Distribution builds can be too old for
// the kernel: Debian's 2022 runsc refuses networking in any namespace of a
// 6.x kernel, taking it for the root one.
const PinnedRunsc = "/usr/local/lib/levers9/runsc"

// DefaultRunscPath returns PinnedRunsc when it is an executable file, else
// "runsc" (looked up on PATH).
func DefaultRunscPath() string {
	if st, err := os.Stat(PinnedRunsc); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
		return PinnedRunsc
	}
	return "runsc"
}

var nodePrefixRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)

// WithDefaults fills every empty field but Resolvers (see BuildNode).
func (c NodeConfig) WithDefaults() NodeConfig {
	if c.Prefix == "" {
		h := sha256.Sum256([]byte(c.MachineID))
		c.Prefix = "l9" + hex.EncodeToString(h[:3])
	}
	if c.ImageRegistry == "" {
		c.ImageRegistry = "index.docker.io"
	}
	if c.RunscPath == "" {
		c.RunscPath = DefaultRunscPath()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
	return c
}

// Validate reports every problem at once, each naming its flag.
func (c NodeConfig) Validate() error {
	var errs []error
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("--state-dir: %q is not an absolute path", c.StateDir))
	}
	if !nodePrefixRE.MatchString(c.Prefix) {
		errs = append(errs, fmt.Errorf("--prefix: %q must be 1-8 of [a-z0-9] starting with a letter", c.Prefix))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("agent node config: %w: %w", errdefs.ErrInvalidArgument, errors.Join(errs...))
}

// Node is what runs tasks on this machine: the Runner and, unless
// NoNetwork, the egress node (whose readiness report goes with the
// heartbeats).
type Node struct {
	Runner *taskrun.Runner
	Egress *egress.Node
	// Seccomp reads the kernel log for seccomp log-mode records once a
	// task runs under that mode.
	Seccomp *SeccompWatch
	// Volumes mounts task volumes on this node.
	Volumes *volumeMounter
	sandbox *sandbox.Sandbox
}

// Readiness returns the egress node as a ReadinessSource, nil without one.
func (n *Node) Readiness() ReadinessSource {
	if n.Egress == nil {
		return nil
	}
	return n.Egress
}

// Close stops the egress node's collection loop; containers and the
// network stay for the next agent (its Reconcile cleans up), and so does
// the cgroup parent while a container is in it.
func (n *Node) Close() {
	if n.sandbox != nil {
		n.sandbox.ReleaseCgroups()
		n.sandbox.Close()
	}
	if n.Egress != nil {
		n.Egress.Stop()
	}
	n.Seccomp.Stop()
	if n.Volumes != nil {
		// The mount processes end with the agent anyway; unmounting now
		// leaves no dead FUSE endpoints for the next agent to clear.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = n.Volumes.UnmountAll(ctx)
	}
}

// BuildNode makes the sandbox (runc, and runsc when installed: c.RunscPath), the image
// cache and the egress node (set up and collecting), and the Runner over
// them. The Runner is not started: the Agent reconciles and starts it.
func BuildNode(ctx context.Context, c NodeConfig) (*Node, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	log := c.Logger
	host, err := sandbox.DetectHost(ctx, sandbox.NVIDIADiscovery{Root: c.GPURoot})
	if err != nil {
		return nil, fmt.Errorf("detect the host: %w", err)
	}
	if host, err = sandbox.LoadAppArmor(ctx, host, ""); err != nil {
		// Hardened containers then run without the profile and report
		// it as not loaded; the node is still usable.
		log.Warn("AppArmor profile not loaded", "profile", sandbox.AppArmorProfileName, "err", err)
	} else if !host.AppArmorEnabled {
		log.Info("AppArmor not enabled on this node: containers run without an AppArmor profile")
	}
	n := &Node{}
	var watch *SeccompWatch
	reader, err := sandbox.NewSeccompLogReader(sandbox.SeccompLogConfig{Prefix: c.Prefix, Logger: log.With("component", "seccomp"),
		Registerer: c.Metrics.Registry,
		OnEvent:    func(ev sandbox.SeccompEvent) { watch.Handle(ev) }})
	if err != nil {
		return nil, err
	}
	observer := c.SeccompObserver
	if observer == nil {
		observer = SeccompObserverFunc(func(pool, task, syscall string) {
			c.Metrics.SeccompLogEvents.WithLabelValues(pool, task, syscall).Inc()
		})
	}
	watch = NewSeccompWatch(SeccompWatchConfig{Reader: reader, Observer: observer, Flush: c.SeccompFlush,
		Logger: log.With("component", "seccomp")})
	n.Seccomp = watch
	sb, err := sandbox.New(sandbox.Config{Prefix: c.Prefix, StateDir: filepath.Join(c.StateDir, "containers"),
		CgroupParent: "/" + c.Prefix, SensitivePaths: []string{c.StateDir}, Host: host, RunscPath: c.RunscPath,
		SeccompLog: reader, Logger: log})
	if err != nil {
		return nil, err
	}
	registries := append([]string{}, c.Registries...)
	for _, r := range c.InsecureRegistries {
		if r != c.ImageRegistry && !slices.Contains(registries, r) {
			registries = append(registries, r)
		}
	}
	store, err := image.New(image.Config{Root: filepath.Join(c.StateDir, "images"), Registry: c.ImageRegistry,
		Registries: registries, InsecureRegistries: c.InsecureRegistries, DiskBudget: c.ImageDiskBudget,
		MountSource: "levers9-" + c.Prefix, Logger: log, Registerer: c.Metrics.Registry,
		// Debian-based images (the runner among them) hold absolute links
		// such as /dev/fd -> /proc/self/fd. The agent never follows a link
		// in an image: what it reads there goes through openat2 with
		// RESOLVE_IN_ROOT, runc resolves mount points inside the root, and
		// a build's capture reads its upper directory without following.
		AllowAbsoluteSymlinks: true})
	if err != nil {
		return nil, err
	}
	if !c.NoNetwork {
		resolvers := c.Resolvers
		if len(resolvers) == 0 {
			resolvers = hostResolvers("/etc/resolv.conf")
			if len(resolvers) == 0 {
				resolvers = []string{"1.1.1.1", "9.9.9.9"}
				log.Warn("no usable resolver in /etc/resolv.conf (only loopback ones); containers use public resolvers, set --resolvers to choose", "resolvers", resolvers)
			}
		}
		owner, err := egress.SelfOwner(c.Prefix, c.MachineID, c.StateDir, "")
		if err != nil {
			return nil, fmt.Errorf("host network: %w", err)
		}
		hc := c.HostNet
		hc.Logger = log
		claim, err := egress.ClaimHost(ctx, hc, owner, egress.Want{SubnetV4: c.SubnetV4, SubnetV6: c.SubnetV6, NFLOGGroup: c.NFLOGGroup})
		if err != nil {
			return nil, fmt.Errorf("this agent cannot get its container network: %w", err)
		}
		log.Info("container network claimed", "prefix", c.Prefix, "subnet_v4", claim.SubnetV4, "subnet_v6", claim.SubnetV6, "nflog_group", claim.NFLOGGroup)
		n.Egress, err = egress.NewNode(egress.Config{Prefix: c.Prefix, SubnetV4: claim.SubnetV4, SubnetV6: claim.SubnetV6, NFLOGGroup: claim.NFLOGGroup,
			Resolvers: resolvers, Controlplane: c.Controlplane, StateDir: filepath.Join(c.StateDir, "network")}, log, c.Metrics.Registry)
		if err != nil {
			return nil, err
		}
		if err := n.Egress.Setup(ctx); err != nil {
			return nil, err
		}
		if err := n.Egress.Start(ctx); err != nil {
			return nil, err
		}
	}
	weed := c.WeedPath
	if weed == "" {
		weed = os.Getenv("LEVERS9_WEED_BIN")
	}
	if weed == "" {
		weed, _ = exec.LookPath("weed")
	}
	n.Volumes = newVolumeMounter(filepath.Join(c.StateDir, "volumes"), weed, log.With("component", "volumes"))
	// A killed agent's mount processes died with it: clear their dead
	// FUSE endpoints before any task mounts again.
	if err := n.Volumes.Reconcile(ctx); err != nil {
		log.Warn("clearing volume mounts an earlier agent left", "err", err)
	}
	n.sandbox = sb
	n.Runner, err = taskrun.New(taskrun.Config{Sandbox: sb, Images: store, Egress: n.Egress, Volumes: n.Volumes,
		StateDir: filepath.Join(c.StateDir, "attempts"), IODir: filepath.Join(c.StateDir, "io"),
		MaxResultBytes: maxResultBytes(tunnel.Limits{}.WithDefaults().MaxMessageSize), Logger: log})
	if err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// hostResolvers returns the non-loopback nameservers of a resolv.conf:
// a loopback resolver (systemd-resolved's 127.0.0.53) is unreachable from
// a container's namespace.
func hostResolvers(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fields[1])
		if err != nil || a.IsLoopback() || a.Zone() != "" {
			continue
		}
		out = append(out, a.String())
	}
	return out
}

// controlplaneAllow is the allow entry for the controlplane's gRPC address
// when it is an IP literal (a name cannot be an allow entry).
func controlplaneAllow(addr string) []string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.IsLoopback() {
		return nil
	}
	if a.Is6() {
		return []string{"[" + a.String() + "]:" + port + "/tcp"}
	}
	return []string{a.String() + ":" + port + "/tcp"}
}
