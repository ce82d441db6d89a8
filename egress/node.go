package egress

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// ContainerNet names a container to attach.
type ContainerNet struct {
	ID   string
	Task string
	Pool string
	// Security overrides the node's worker.containerSecurity for this
	// container (worker.pools.NAME.security, already merged with the
	// defaults by the caller: an empty mode is refused); nil uses the
	// node's.
	Security *SecurityConfig
}

// Attachment is what the sandbox needs to run a container on the network:
// the namespace to join and the resolv.conf to bind-mount.
type Attachment struct {
	NetnsPath      string
	IPv4, IPv6     netip.Addr
	Gateway4       netip.Addr
	Gateway6       netip.Addr
	ResolvConfPath string
	// Mode is the egress mode the container's chains were installed in
	// (the pool's override, else the node's), as applied.
	Mode Mode
}

type container struct {
	net       ContainerNet
	pol       policy
	key       string
	a4, a6    netip.Addr
	nsPath    string
	resolvDir string
}

// Option adjusts a Node.
type Option func(*Node)

// WithClock injects the clock the readiness report uses.
func WithClock(c clock.Clock) Option { return func(n *Node) { n.clock = clock.OrReal(c) } }

// Node owns one node's container network. All methods are safe for
// concurrent use; Setup, AddContainer, RemoveContainer, Reconcile, Collect
// and Uninstall serialise on one lock and block while they run iptables.
type Node struct {
	plan      *plan
	log       *slog.Logger
	ns        netNS
	clock     clock.Clock
	matches   *prometheus.CounterVec
	readiness *Readiness
	logLimit  *logLimiter
	ipts      []*ipt

	// mu guards everything below and serialises rule changes.
	mu        sync.Mutex
	ctrs      map[string]*container // by key
	byAddr    map[netip.Addr]string // container key by address
	labels    map[string]ContainerNet
	poolModes map[string]Mode       // last mode seen per pool, for reports
	base      map[counterKey]uint64 // counts carried from retired chains
	exported  map[counterKey]uint64
	setupDone bool
	brNF      bool

	// runMu guards the loop state.
	runMu  sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	conn   *nflogConn
}

// NewNode validates cfg (after defaults) and registers the metric on reg
// (nil: not registered). It touches no host state.
func NewNode(cfg Config, logger *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Node, error) {
	p, err := cfg.WithDefaults().plan()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	n := &Node{
		plan: p, log: logger.With("component", "egress"), ns: netNS{path: p.cfg.NodeNetns}, clock: clock.Real(),
		ctrs: map[string]*container{}, byAddr: map[netip.Addr]string{}, labels: map[string]ContainerNet{},
		base: map[counterKey]uint64{}, exported: map[counterKey]uint64{}, poolModes: map[string]Mode{},
	}
	for _, o := range opts {
		o(n)
	}
	n.readiness = NewReadiness(p.cfg.ReportWindow, n.clock)
	n.logLimit = newLogLimiter(p.cfg.LogPerMinute, p.cfg.LogBurst, n.clock)
	n.matches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "worker_container_egress_matches_total",
		Help: "Packets from containers that matched a blocked egress class (refused in enforce mode, counted only in observe mode).",
	}, []string{"pool", "task", "class"})
	if reg != nil {
		if err := reg.Register(n.matches); err != nil {
			return nil, fmt.Errorf("register egress metric: %w", err)
		}
	}
	return n, nil
}

// Config returns the effective configuration.
func (n *Node) Config() Config { return n.plan.cfg }

// policyFor resolves a container's policy: its override or the node's.
func (n *Node) policyFor(cn ContainerNet) (policy, error) {
	if cn.Security == nil {
		return n.plan.policy, nil
	}
	pol, err := cn.Security.parse("worker.pools." + cn.Pool + ".security")
	if err != nil {
		return policy{}, fmt.Errorf("container %s: %w", cn.ID, err)
	}
	return pol, nil
}

func keyOf(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:4])
}

// Setup creates the bridge, enables forwarding and bridge netfilter, and
// installs the rules. Idempotent.
func (n *Node) Setup(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.setupLocked(ctx)
}

func (n *Node) setupLocked(ctx context.Context) error {
	if n.ipts == nil {
		for _, f := range []family{v4, v6} {
			x, err := newIPT(f, n.plan.cfg.Prefix)
			if err != nil {
				return fmt.Errorf("egress setup: %w: %w", errdefs.ErrFailedPrecondition, err)
			}
			n.ipts = append(n.ipts, x)
		}
	}
	h, err := n.ns.handle()
	if err != nil {
		return fmt.Errorf("egress setup: %w", err)
	}
	defer h.Close()
	if _, err := ensureBridge(h, n.plan); err != nil {
		return fmt.Errorf("egress setup: %w", err)
	}
	err = n.ns.do(func() error {
		for _, s := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}} {
			if err := writeSysctl(s[0], s[1]); err != nil {
				return err
			}
		}
		// Without br_netfilter, bridged (not routed) frames skip
		// iptables; port isolation still keeps containers apart.
		n.brNF = false
		if _, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables"); err == nil {
			for _, s := range []string{"net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables"} {
				if err := writeSysctl(s, "1"); err != nil {
					return err
				}
			}
			n.brNF = true
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("egress setup: %w", err)
	}
	if !n.brNF {
		n.log.Warn("br_netfilter is not loaded: bridged traffic between containers is not seen by iptables; bridge port isolation still applies")
	}
	if err := os.MkdirAll(n.plan.cfg.StateDir, 0o755); err != nil {
		return fmt.Errorf("egress setup: state dir: %w", err)
	}
	n.setupDone = true
	return n.applyLocked(ctx)
}

// BridgeNetfilter reports whether br_netfilter was found and enabled.
func (n *Node) BridgeNetfilter() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.brNF
}

func (n *Node) allocLocked() (netip.Addr, netip.Addr, error) {
	p := n.plan
	for a4, a6 := p.gw4.Next(), p.gw6.Next(); p.v4.Contains(a4) && p.v6.Contains(a6); a4, a6 = a4.Next(), a6.Next() {
		if _, used := n.byAddr[a4]; used {
			continue
		}
		if _, used := n.byAddr[a6]; used {
			continue
		}
		if !p.v4.Contains(a4.Next()) { // the broadcast address
			break
		}
		return a4, a6, nil
	}
	return netip.Addr{}, netip.Addr{}, fmt.Errorf("container subnet %s is full: %w", p.v4, errdefs.ErrUnavailable)
}

func (n *Node) attachment(c *container) *Attachment {
	return &Attachment{NetnsPath: c.nsPath, IPv4: c.a4, IPv6: c.a6, Gateway4: n.plan.gw4, Gateway6: n.plan.gw6,
		ResolvConfPath: filepath.Join(c.resolvDir, "resolv.conf"), Mode: c.pol.mode}
}

// AddContainer creates the container's namespace, veth, addresses and
// resolv.conf, and its egress chains. Idempotent for the same ID.
func (n *Node) AddContainer(ctx context.Context, cn ContainerNet) (*Attachment, error) {
	if cn.ID == "" {
		return nil, fmt.Errorf("add container: empty ID: %w", errdefs.ErrInvalidArgument)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.setupDone {
		return nil, fmt.Errorf("add container %s: Setup has not run: %w", cn.ID, errdefs.ErrFailedPrecondition)
	}
	pol, err := n.policyFor(cn)
	if err != nil {
		return nil, fmt.Errorf("add container: %w", err)
	}
	key := keyOf(cn.ID)
	if c := n.ctrs[key]; c != nil {
		if c.net.ID != cn.ID {
			return nil, fmt.Errorf("add container %s: key %s taken by %s: %w", cn.ID, key, c.net.ID, errdefs.ErrAlreadyExists)
		}
		return n.attachment(c), nil
	}
	for k := range n.ctrs {
		if k[:6] == key[:6] {
			return nil, fmt.Errorf("add container %s: interface name collides with container %s: %w", cn.ID, n.ctrs[k].net.ID, errdefs.ErrAlreadyExists)
		}
	}
	a4, a6, err := n.allocLocked()
	if err != nil {
		return nil, fmt.Errorf("add container %s: %w", cn.ID, err)
	}
	c := &container{net: cn, pol: pol, key: key, a4: a4, a6: a6,
		nsPath:    filepath.Join(netnsDir, names{n.plan.cfg.Prefix}.netns(key)),
		resolvDir: filepath.Join(n.plan.cfg.StateDir, names{n.plan.cfg.Prefix}.netns(key))}
	if err := n.createLocked(c); err != nil {
		n.destroy(c.key)
		return nil, fmt.Errorf("add container %s: %w", cn.ID, err)
	}
	n.trackLocked(c)
	if err := n.applyLocked(ctx); err != nil {
		n.untrackLocked(c)
		n.destroy(c.key)
		return nil, fmt.Errorf("add container %s: %w", cn.ID, err)
	}
	n.log.Info("container attached", "container_id", cn.ID, "task_id", cn.Task, "pool", cn.Pool, "ipv4", a4, "ipv6", a6)
	return n.attachment(c), nil
}

func (n *Node) createLocked(c *container) error {
	name := names{n.plan.cfg.Prefix}.netns(c.key)
	ns, err := createContainerNetns(name)
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := n.ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	br, err := h.LinkByName(names{n.plan.cfg.Prefix}.bridge())
	if err != nil {
		return fmt.Errorf("look up bridge: %w", err)
	}
	if err := attachVeth(h, n.plan, br, c.key, c.pol.isolation, ns, c.a4, c.a6); err != nil {
		return err
	}
	if err := os.MkdirAll(c.resolvDir, 0o755); err != nil {
		return fmt.Errorf("resolv.conf dir: %w", err)
	}
	var b strings.Builder
	for _, r := range n.plan.resolvers {
		fmt.Fprintf(&b, "nameserver %s\n", r)
	}
	b.WriteString("options edns0\n")
	if err := os.WriteFile(filepath.Join(c.resolvDir, "resolv.conf"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write resolv.conf: %w", err)
	}
	return nil
}

func (n *Node) trackLocked(c *container) {
	n.ctrs[c.key] = c
	n.byAddr[c.a4], n.byAddr[c.a6] = c.key, c.key
	n.labels[c.key] = c.net
	n.poolModes[c.net.Pool] = c.pol.mode
}

func (n *Node) untrackLocked(c *container) {
	delete(n.ctrs, c.key)
	delete(n.byAddr, c.a4)
	delete(n.byAddr, c.a6)
}

// destroy removes a container's host objects by name; missing is fine.
func (n *Node) destroy(key string) error {
	nm := names{n.plan.cfg.Prefix}
	var errs []error
	if err := deleteNetns(nm.netns(key)); err != nil {
		errs = append(errs, err)
	}
	if h, err := n.ns.handle(); err == nil {
		if l, err := h.LinkByName(nm.hostVeth(key)); err == nil {
			if err := h.LinkDel(l); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("delete veth %s: %w", nm.hostVeth(key), err))
			}
		}
		h.Close()
	} else {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(filepath.Join(n.plan.cfg.StateDir, nm.netns(key))); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Attached returns the attachment of a container this node tracks.
func (n *Node) Attached(id string) (*Attachment, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.ctrs[keyOf(id)]
	if c == nil || c.net.ID != id {
		return nil, false
	}
	return n.attachment(c), true
}

// RemoveContainer removes the container's chains (carrying their counts),
// namespace, veth and resolv.conf. Idempotent; unknown IDs are cleaned up
// by name.
func (n *Node) RemoveContainer(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	key := keyOf(id)
	if c := n.ctrs[key]; c != nil {
		n.untrackLocked(c)
		if err := n.applyLocked(ctx); err != nil {
			return fmt.Errorf("remove container %s: %w", id, err)
		}
	}
	if err := n.destroy(key); err != nil {
		return fmt.Errorf("remove container %s: %w", id, err)
	}
	return nil
}

// applyLocked installs the rules for the tracked containers in both
// families. The families are independent tables, so they are applied side
// by side: each is an iptables-save and an iptables-restore, and a
// container's start waits for the slower one instead of the sum.
func (n *Node) applyLocked(ctx context.Context) error {
	var ctrs []ctrRules
	for _, c := range n.ctrs {
		veth := ""
		if n.brNF {
			veth = names{n.plan.cfg.Prefix}.hostVeth(c.key)
		}
		ctrs = append(ctrs, ctrRules{key: c.key, addr: c.a4, pol: c.pol, veth: veth}, ctrRules{key: c.key, addr: c.a6, pol: c.pol, veth: veth})
	}
	results := make([]applyResult, len(n.ipts))
	errs := make([]error, len(n.ipts))
	var wg sync.WaitGroup
	for i, x := range n.ipts {
		rs := buildRules(n.plan, x.fam, append([]ctrRules(nil), ctrs...))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.ns.do(func() error {
				var err error
				results[i], err = x.apply(ctx, rs)
				return err
			})
		}()
	}
	wg.Wait()
	for i, x := range n.ipts {
		// A family that failed left its tables as they were; the other's
		// change stands, and the next apply converges both.
		n.carry(results[i].retired)
		if results[i].moved {
			n.log.Warn("egress hooks were not first in their chains; moved back to position 1", "family", x.fam.String())
		}
	}
	return errors.Join(errs...)
}

// carry adds the counters of retired chains to base, so totals never go
// backwards. Called with mu held.
func (n *Node) carry(retired map[counterKey]uint64) {
	for k, v := range retired {
		n.base[k] += v
	}
}

// gone reports whether a delete failed only because the namespace teardown
// (asynchronous in the kernel) already removed the device.
func gone(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.Is(err, unix.ENODEV) || errors.As(err, &nf)
}
