package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/procstat"
)

// Host-wide network resources. A bridge, its subnets, an NFLOG group and
// the iptables chains belong to the host (its network namespace), not to an
// agent's state directory, so several agents on one host (two local stacks,
// one agent per local pool, a re-join under a new machine ID) must not pick
// the same ones, and what an agent that no longer runs left behind must go.
// The host allocator keeps one small JSON file of claims under a flock'd
// lock file in HostConfig.Dir: each claim names its owner (agent pid and
// its start time, state directory, machine ID, object prefix, network
// namespace) and what it holds (IPv4 and IPv6 subnets, NFLOG group).
//
//	claim:  lock → read claims → stale ones (owner dead or state dir gone,
//	        another prefix) in this namespace: remove their bridge, chains,
//	        namespaces and NAT rules (Uninstall), drop the claim →
//	        our own earlier claim (same prefix): take it over as it is →
//	        else pick the first free subnets (no live claim, host route or
//	        address overlaps) and the first free NFLOG group (no live
//	        claim, and binding it works) → write claims → unlock
//
// A live agent's claim is never touched.

// Host allocator defaults.
const (
	DefaultHostDir     = "/run/levers9/hostnet"
	DefaultHostPoolV4  = "10.208.0.0/12"
	DefaultHostBitsV4  = 22
	DefaultHostPoolV6  = "fd6c:7639:9000::/52"
	DefaultNFLOGFirst  = 1993
	DefaultNFLOGGroups = 256
)

// HostConfig configures the host allocator.
type HostConfig struct {
	// Dir holds the lock and the claims (default DefaultHostDir; on a
	// tmpfs, since bridges do not survive a reboot either).
	Dir string
	// PoolV4 is split into subnets of BitsV4 bits, one per agent; PoolV6
	// into /64s.
	PoolV4 string
	BitsV4 int
	PoolV6 string
	// NFLOGFirst and NFLOGGroups: the groups agents may take.
	NFLOGFirst  uint16
	NFLOGGroups int
	// NodeNetns is the namespace the bridges live in ("" the caller's).
	NodeNetns string
	Logger    *slog.Logger
}

// WithDefaults fills every unset field.
func (c HostConfig) WithDefaults() HostConfig {
	if c.Dir == "" {
		c.Dir = DefaultHostDir
	}
	if c.PoolV4 == "" {
		c.PoolV4 = DefaultHostPoolV4
	}
	if c.BitsV4 == 0 {
		c.BitsV4 = DefaultHostBitsV4
	}
	if c.PoolV6 == "" {
		c.PoolV6 = DefaultHostPoolV6
	}
	if c.NFLOGFirst == 0 {
		c.NFLOGFirst = DefaultNFLOGFirst
	}
	if c.NFLOGGroups == 0 {
		c.NFLOGGroups = DefaultNFLOGGroups
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Owner names the agent a claim belongs to.
type Owner struct {
	Prefix    string `json:"prefix"`
	MachineID string `json:"machineID"`
	StateDir  string `json:"stateDir"`
	PID       int    `json:"pid"`
	// PIDStart is the process's start time in clock ticks since boot, so
	// a reused pid is not taken for the agent.
	PIDStart uint64 `json:"pidStart"`
	// Netns identifies the network namespace (device:inode).
	Netns string `json:"netns"`
}

// HostClaim is what one agent holds on the host.
type HostClaim struct {
	Owner      Owner  `json:"owner"`
	SubnetV4   string `json:"subnetV4"`
	SubnetV6   string `json:"subnetV6"`
	NFLOGGroup uint16 `json:"nflogGroup"`
}

// Want is what the agent asks for; a set field is taken as it is (an
// explicit --subnet-v4 or --nflog-group), an empty one is allocated.
type Want struct {
	SubnetV4, SubnetV6 string
	NFLOGGroup         uint16
}

// SelfOwner returns the calling process as an owner.
func SelfOwner(prefix, machineID, stateDir, nodeNetns string) (Owner, error) {
	start, err := pidStart(os.Getpid())
	if err != nil {
		return Owner{}, err
	}
	ns, err := netnsID(nodeNetns)
	if err != nil {
		return Owner{}, err
	}
	return Owner{Prefix: prefix, MachineID: machineID, StateDir: stateDir, PID: os.Getpid(), PIDStart: start, Netns: ns}, nil
}

// pidStart is the process's start time, which with its pid names it.
func pidStart(pid int) (uint64, error) {
	st, err := procstat.Read(pid)
	return st.StartTime, err
}

func netnsID(path string) (string, error) {
	if path == "" {
		path = "/proc/self/ns/net"
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("network namespace %s: %w", path, err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}

// Alive reports whether the owner still runs: its process (same start
// time) exists and its state directory is there.
func (o Owner) Alive() bool {
	if o.PID <= 0 {
		return false
	}
	if err := syscall.Kill(o.PID, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if st, err := procstat.Read(o.PID); err != nil || st.StartTime != o.PIDStart || st.Exited() {
		// A killed agent nobody reaped yet stays in the process table,
		// start time and all, but holds nothing.
		return false
	}
	if o.StateDir != "" {
		if _, err := os.Stat(o.StateDir); err != nil {
			return false
		}
	}
	return true
}

// hostLock holds the allocator's flock.
type hostLock struct{ f *os.File }

func lockHost(dir string) (*hostLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("host network state %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("host network lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("host network lock: %w", err)
	}
	return &hostLock{f: f}, nil
}

func (l *hostLock) unlock() {
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	_ = l.f.Close()
}

func readClaims(dir string) ([]HostClaim, error) {
	b, err := os.ReadFile(filepath.Join(dir, "claims.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read host network claims: %w", err)
	}
	var cs []HostClaim
	if err := json.Unmarshal(b, &cs); err != nil {
		return nil, fmt.Errorf("read host network claims %s: %w", filepath.Join(dir, "claims.json"), err)
	}
	return cs, nil
}

func writeClaims(dir string, cs []HostClaim) error {
	b, err := json.MarshalIndent(cs, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "claims.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write host network claims: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "claims.json")); err != nil {
		return fmt.Errorf("write host network claims: %w", err)
	}
	return nil
}

// Claims returns the host's claims (for reports and tests).
func Claims(hc HostConfig) ([]HostClaim, error) {
	hc = hc.WithDefaults()
	l, err := lockHost(hc.Dir)
	if err != nil {
		return nil, err
	}
	defer l.unlock()
	return readClaims(hc.Dir)
}

// RemoveHostObjects removes every host object carrying prefix from the
// namespace nodeNetns: bridge, veths, container namespaces, hooks and
// chains (filter and NAT) in both families, resolv.conf directories under
// stateDir. Missing objects are fine.
func RemoveHostObjects(ctx context.Context, prefix, nodeNetns, stateDir string) error {
	if stateDir == "" {
		stateDir = filepath.Join(os.TempDir(), "levers9-gone")
	}
	n, err := NewNode(Config{Prefix: prefix, NodeNetns: nodeNetns, StateDir: stateDir, Resolvers: []string{"192.0.2.53"}}, nil, nil)
	if err != nil {
		return err
	}
	return n.Uninstall(ctx)
}

// ClaimHost gives the owner its subnets and NFLOG group, after removing
// what owners that no longer run left in this namespace. It returns the
// claim, which stays recorded until ReleaseHost; a later agent with the
// same prefix takes it over.
func ClaimHost(ctx context.Context, hc HostConfig, me Owner, want Want) (HostClaim, error) {
	hc = hc.WithDefaults()
	pool4, err := netip.ParsePrefix(hc.PoolV4)
	if err != nil || !pool4.Addr().Is4() || pool4.Masked() != pool4 || hc.BitsV4 < pool4.Bits() || hc.BitsV4 > 29 {
		return HostClaim{}, fmt.Errorf("worker.network.subnetPoolV4: %q is not an IPv4 network holding /%d subnets: %w", hc.PoolV4, hc.BitsV4, errdefs.ErrInvalidArgument)
	}
	pool6, err := netip.ParsePrefix(hc.PoolV6)
	if err != nil || !pool6.Addr().Is6() || pool6.Masked() != pool6 || pool6.Bits() > 64 {
		return HostClaim{}, fmt.Errorf("worker.network.subnetPoolV6: %q is not an IPv6 network of at most /64: %w", hc.PoolV6, errdefs.ErrInvalidArgument)
	}
	l, err := lockHost(hc.Dir)
	if err != nil {
		return HostClaim{}, err
	}
	defer l.unlock()
	claims, err := readClaims(hc.Dir)
	if err != nil {
		return HostClaim{}, err
	}
	var keep []HostClaim
	var mine *HostClaim
	for _, c := range claims {
		switch {
		case c.Owner.Prefix == me.Prefix && c.Owner.Netns == me.Netns:
			if c.Owner.PID != me.PID && c.Owner.Alive() {
				return HostClaim{}, fmt.Errorf("another agent (pid %d, state dir %s) runs with the same prefix %s on this host: %w",
					c.Owner.PID, c.Owner.StateDir, me.Prefix, errdefs.ErrFailedPrecondition)
			}
			c := c
			mine = &c
		case c.Owner.Alive():
			keep = append(keep, c)
		case c.Owner.Netns != me.Netns:
			// Another namespace's: nothing of it is reachable from here.
			hc.Logger.Info("dropping the host network claim of an agent that no longer runs", "prefix", c.Owner.Prefix, "machine_id", c.Owner.MachineID)
		default:
			if err := RemoveHostObjects(ctx, c.Owner.Prefix, hc.NodeNetns, filepath.Join(c.Owner.StateDir, "network")); err != nil {
				hc.Logger.Warn("removing what an agent that no longer runs left; its claim stays", "prefix", c.Owner.Prefix, "machine_id", c.Owner.MachineID, "err", err)
				keep = append(keep, c)
				continue
			}
			hc.Logger.Info("removed the bridge, chains and claim of an agent that no longer runs",
				"prefix", c.Owner.Prefix, "machine_id", c.Owner.MachineID, "pid", c.Owner.PID, "state_dir", c.Owner.StateDir, "subnet_v4", c.SubnetV4)
		}
	}
	claim := HostClaim{Owner: me, SubnetV4: want.SubnetV4, SubnetV6: want.SubnetV6, NFLOGGroup: want.NFLOGGroup}
	if mine != nil {
		if claim.SubnetV4 == "" {
			claim.SubnetV4 = mine.SubnetV4
		}
		if claim.SubnetV6 == "" {
			claim.SubnetV6 = mine.SubnetV6
		}
		if claim.NFLOGGroup == 0 {
			claim.NFLOGGroup = mine.NFLOGGroup
		}
	}
	var used4, used6 []netip.Prefix
	groups := map[uint16]HostClaim{}
	for _, c := range keep {
		if p, err := netip.ParsePrefix(c.SubnetV4); err == nil {
			used4 = append(used4, p)
		}
		if p, err := netip.ParsePrefix(c.SubnetV6); err == nil {
			used6 = append(used6, p)
		}
		groups[c.NFLOGGroup] = c
	}
	for _, s := range []struct {
		key, val string
		used     []netip.Prefix
	}{{"--subnet-v4", claim.SubnetV4, used4}, {"--subnet-v6", claim.SubnetV6, used6}} {
		if s.val == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s.val); err == nil {
			for _, u := range s.used {
				if u.Overlaps(p) {
					return HostClaim{}, fmt.Errorf("%s %s overlaps subnet %s of a running agent on this host; leave it unset so the agent picks a free one: %w", s.key, s.val, u, errdefs.ErrFailedPrecondition)
				}
			}
		}
	}
	if c, ok := groups[claim.NFLOGGroup]; ok && claim.NFLOGGroup != 0 {
		return HostClaim{}, fmt.Errorf("NFLOG group %d is held by a running agent on this host (pid %d, machine %s); leave --nflog-group unset so the agent picks a free one: %w",
			claim.NFLOGGroup, c.Owner.PID, c.Owner.MachineID, errdefs.ErrFailedPrecondition)
	}
	ns := netNS{path: hc.NodeNetns}
	if claim.SubnetV4 == "" || claim.SubnetV6 == "" {
		routes4, routes6, err := hostPrefixes(ns, me.Prefix)
		if err != nil {
			return HostClaim{}, err
		}
		if claim.SubnetV4 == "" {
			p, ok := freeSubnet(pool4, hc.BitsV4, append(used4, routes4...))
			if !ok {
				return HostClaim{}, fmt.Errorf("no free container subnet for this agent: every /%d of %s overlaps a running agent's subnet or a route or address of this host; stop an agent (`make down`) or set worker.network.subnetPoolV4: %w",
					hc.BitsV4, pool4, errdefs.ErrUnavailable)
			}
			claim.SubnetV4 = p.String()
		}
		if claim.SubnetV6 == "" {
			p, ok := freeSubnet(pool6, 64, append(used6, routes6...))
			if !ok {
				return HostClaim{}, fmt.Errorf("no free IPv6 container subnet for this agent: every /64 of %s overlaps a running agent's subnet or a route or address of this host: %w",
					pool6, errdefs.ErrUnavailable)
			}
			claim.SubnetV6 = p.String()
		}
	}
	if claim.NFLOGGroup == 0 {
		for i := 0; i < hc.NFLOGGroups; i++ {
			g := hc.NFLOGFirst + uint16(i)
			if _, taken := groups[g]; taken || g == 0 {
				continue
			}
			if nflogFree(ns, g) {
				claim.NFLOGGroup = g
				break
			}
		}
		if claim.NFLOGGroup == 0 {
			return HostClaim{}, fmt.Errorf("no free NFLOG group for this agent: groups %d-%d are all bound by other programs or agents on this host: %w",
				hc.NFLOGFirst, int(hc.NFLOGFirst)+hc.NFLOGGroups-1, errdefs.ErrUnavailable)
		}
	} else if mine == nil || mine.NFLOGGroup != claim.NFLOGGroup {
		if !nflogFree(ns, claim.NFLOGGroup) {
			return HostClaim{}, NFLOGTakenError(claim.NFLOGGroup)
		}
	}
	keep = append(keep, claim)
	if err := writeClaims(hc.Dir, keep); err != nil {
		return HostClaim{}, err
	}
	return claim, nil
}

// NFLOGTakenError is the one sentence an agent gives when its NFLOG group
// is bound by another process.
func NFLOGTakenError(group uint16) error {
	return fmt.Errorf("NFLOG group %d is already bound by another program on this host (another levers9 agent?); leave --nflog-group unset so the agent picks a free one: %w",
		group, errdefs.ErrFailedPrecondition)
}

// ReleaseHost removes the objects of the claims whose prefix is in
// prefixes (all claims when empty) and drops them: `make down` calls it
// after stopping its agents. Claims of agents still running are kept
// unless force. A prefix without a claim (an agent older than claims)
// has its objects removed by name.
func ReleaseHost(ctx context.Context, hc HostConfig, prefixes []string, force bool) error {
	hc = hc.WithDefaults()
	l, err := lockHost(hc.Dir)
	if err != nil {
		return err
	}
	defer l.unlock()
	claims, err := readClaims(hc.Dir)
	if err != nil {
		return err
	}
	here, err := netnsID(hc.NodeNetns)
	if err != nil {
		return err
	}
	var keep []HostClaim
	var errs []error
	for _, pre := range prefixes {
		if !slices.ContainsFunc(claims, func(c HostClaim) bool { return c.Owner.Prefix == pre }) {
			// An agent from before claims: its objects by name.
			if err := RemoveHostObjects(ctx, pre, hc.NodeNetns, ""); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, c := range claims {
		if len(prefixes) > 0 && !slices.Contains(prefixes, c.Owner.Prefix) || !force && c.Owner.Alive() {
			keep = append(keep, c)
			continue
		}
		if c.Owner.Netns == here {
			if err := RemoveHostObjects(ctx, c.Owner.Prefix, hc.NodeNetns, filepath.Join(c.Owner.StateDir, "network")); err != nil {
				errs = append(errs, err)
				keep = append(keep, c)
			}
		}
	}
	if err := writeClaims(hc.Dir, keep); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// hostPrefixes lists the networks of the namespace's routes (main table,
// not default ones) and addresses, except those on our own bridge.
func hostPrefixes(ns netNS, prefix string) (v4, v6 []netip.Prefix, err error) {
	h, err := ns.handle()
	if err != nil {
		return nil, nil, err
	}
	defer h.Close()
	own := -1
	if l, err := h.LinkByName(names{prefix}.bridge()); err == nil {
		own = l.Attrs().Index
	}
	add := func(ipn interface{ String() string }) {
		p, err := netip.ParsePrefix(ipn.String())
		if err != nil || p.Bits() == 0 {
			return
		}
		p = p.Masked()
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := h.RouteList(nil, fam)
		if err != nil {
			return nil, nil, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst != nil && r.LinkIndex != own {
				add(r.Dst)
			}
		}
		addrs, err := h.AddrList(nil, fam)
		if err != nil {
			return nil, nil, fmt.Errorf("list addresses: %w", err)
		}
		for _, a := range addrs {
			if a.LinkIndex != own && a.IPNet != nil {
				add(a.IPNet)
			}
		}
	}
	return v4, v6, nil
}

// freeSubnet returns the first subnet of bits bits in pool that overlaps
// none of used.
func freeSubnet(pool netip.Prefix, bits int, used []netip.Prefix) (netip.Prefix, bool) {
	if bits < pool.Bits() {
		return netip.Prefix{}, false
	}
	a := pool.Addr()
	for pool.Contains(a) {
		p := netip.PrefixFrom(a, bits)
		free := true
		for _, u := range used {
			if u.Overlaps(p) {
				free = false
				break
			}
		}
		if free {
			return p, true
		}
		next, ok := addBlock(a, bits)
		if !ok {
			break
		}
		a = next
	}
	return netip.Prefix{}, false
}

// addBlock returns a plus one block of a /bits network.
func addBlock(a netip.Addr, bits int) (netip.Addr, bool) {
	b := a.AsSlice()
	pos := bits - 1 // the bit to add at
	for i := pos / 8; i >= 0; i-- {
		inc := byte(1) << (7 - pos%8)
		if i != pos/8 {
			inc = 1
		}
		s := uint16(b[i]) + uint16(inc)
		b[i] = byte(s)
		if s < 256 {
			r, _ := netip.AddrFromSlice(b)
			return r, true
		}
	}
	return netip.Addr{}, false
}

// nflogFree reports whether group can be bound in the namespace now.
func nflogFree(ns netNS, group uint16) bool {
	err := ns.do(func() error {
		c, err := openNFLOG(group)
		if err != nil {
			return err
		}
		return c.Close()
	})
	return err == nil
}
