package egress

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named network namespaces are bind-mounted (as by
// `ip netns add`).
const netnsDir = "/run/netns"

func writeSysctl(name, value string) error {
	p := "/proc/sys/" + strings.ReplaceAll(name, ".", "/")
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

// ensureBridge creates (or finds) the bridge with both gateway addresses.
func ensureBridge(h *netlink.Handle, p *plan) (netlink.Link, error) {
	name := names{p.cfg.Prefix}.bridge()
	l, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, fmt.Errorf("look up bridge %s: %w", name, err)
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := h.LinkAdd(br); err != nil {
			return nil, fmt.Errorf("create bridge %s: %w", name, err)
		}
		if l, err = h.LinkByName(name); err != nil {
			return nil, fmt.Errorf("look up bridge %s: %w", name, err)
		}
	}
	// A bridge without a MAC of its own takes its lowest port's, so a new
	// container's veth can change the gateway's MAC under every other
	// container: their cached neighbour entry then points nowhere and
	// their traffic stalls for seconds. An address set explicitly sticks.
	if mac := bridgeMAC(name); !bytes.Equal(l.Attrs().HardwareAddr, mac) {
		if err := h.LinkSetHardwareAddr(l, mac); err != nil {
			return nil, fmt.Errorf("fix the MAC address of bridge %s: %w", name, err)
		}
	}
	for _, a := range []*netlink.Addr{
		{IPNet: ipNet(p.gw4, p.v4.Bits())},
		{IPNet: ipNet(p.gw6, p.v6.Bits()), Flags: unix.IFA_F_NODAD},
	} {
		if err := h.AddrReplace(l, a); err != nil {
			return nil, fmt.Errorf("address %s on bridge %s: %w", a.IPNet, name, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("bring up bridge %s: %w", name, err)
	}
	return l, nil
}

// bridgeMAC is a locally administered unicast MAC derived from the bridge's
// name, so it survives agent restarts.
func bridgeMAC(name string) net.HardwareAddr {
	h := sha256.Sum256([]byte("levers9 bridge " + name))
	mac := net.HardwareAddr(h[:6])
	mac[0] = mac[0]&0xfe | 0x02
	return mac
}

// createContainerNetns creates the named namespace with loopback up and the
// sysctls a container needs (ping_group_range for ICMP datagram sockets when
// NET_RAW is dropped, no router advertisements). It returns a handle the
// caller closes.
func createContainerNetns(name string) (netns.NsHandle, error) {
	type result struct {
		ns  netns.NsHandle
		err error
	}
	rc := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			rc <- result{err: fmt.Errorf("get current netns: %w", err)}
			return
		}
		defer orig.Close()
		if err := os.MkdirAll(netnsDir, 0o755); err != nil {
			runtime.UnlockOSThread()
			rc <- result{err: err}
			return
		}
		ns, err := netns.NewNamed(name)
		if err == nil {
			err = setupInsideNetns()
			if err != nil {
				ns.Close()
			}
		}
		if rerr := netns.Set(orig); rerr == nil {
			runtime.UnlockOSThread()
		}
		if err != nil {
			_ = netns.DeleteNamed(name)
			rc <- result{err: fmt.Errorf("create netns %s: %w", name, err)}
			return
		}
		rc <- result{ns: ns}
	}()
	r := <-rc
	return r.ns, r.err
}

// setupInsideNetns runs on a thread inside the new container namespace.
func setupInsideNetns() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	for _, s := range [][2]string{
		{"net.ipv4.ping_group_range", "0 2147483647"},
		{"net.ipv6.conf.all.accept_ra", "0"},
		{"net.ipv6.conf.default.accept_ra", "0"},
	} {
		if err := writeSysctl(s[0], s[1]); err != nil {
			return err
		}
	}
	return nil
}

// deleteNetns unmounts and removes a named namespace; missing is fine.
func deleteNetns(name string) error {
	p := filepath.Join(netnsDir, name)
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", name, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", name, err)
	}
	return nil
}

// attachVeth creates the veth pair, puts the peer into the container
// namespace as eth0 with its addresses and default routes, and the host end
// on the bridge (isolated when asked).
func attachVeth(h *netlink.Handle, p *plan, br netlink.Link, key string, isolation bool, ctrNs netns.NsHandle, a4, a6 netip.Addr) error {
	n := names{p.cfg.Prefix}
	host, peer := n.hostVeth(key), n.peerVeth(key)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: host, MTU: br.Attrs().MTU},
		PeerName:      peer,
		PeerNamespace: netlink.NsFd(int(ctrNs)),
	}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s: %w", host, err)
	}
	hl, err := h.LinkByName(host)
	if err != nil {
		return fmt.Errorf("look up veth %s: %w", host, err)
	}
	if err := h.LinkSetMaster(hl, br); err != nil {
		return fmt.Errorf("attach %s to bridge: %w", host, err)
	}
	if isolation {
		if err := h.LinkSetIsolated(hl, true); err != nil {
			return fmt.Errorf("isolate bridge port %s: %w", host, err)
		}
	}
	if err := h.LinkSetHairpin(hl, false); err != nil {
		return fmt.Errorf("hairpin off on %s: %w", host, err)
	}
	if err := h.LinkSetUp(hl); err != nil {
		return fmt.Errorf("bring up %s: %w", host, err)
	}
	ch, err := netlink.NewHandleAt(ctrNs)
	if err != nil {
		return fmt.Errorf("netlink in container netns: %w", err)
	}
	defer ch.Close()
	pl, err := ch.LinkByName(peer)
	if err != nil {
		return fmt.Errorf("look up %s in container netns: %w", peer, err)
	}
	if err := ch.LinkSetName(pl, "eth0"); err != nil {
		return fmt.Errorf("rename %s to eth0: %w", peer, err)
	}
	// Host-length addresses: nothing is on-link but the gateway, so even
	// traffic to a neighbour container is routed through the node, where
	// the egress chains see (and attribute) it; port isolation is the
	// layer-2 backstop.
	if err := ch.AddrAdd(pl, &netlink.Addr{IPNet: ipNet(a4, 32)}); err != nil {
		return fmt.Errorf("address %s on eth0: %w", a4, err)
	}
	if err := ch.AddrAdd(pl, &netlink.Addr{IPNet: ipNet(a6, 128), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("address %s on eth0: %w", a6, err)
	}
	if err := ch.LinkSetUp(pl); err != nil {
		return fmt.Errorf("bring up eth0: %w", err)
	}
	for _, gw := range []netip.Addr{p.gw4, p.gw6} {
		if err := ch.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Dst: ipNet(gw, gw.BitLen()), Scope: netlink.SCOPE_LINK}); err != nil {
			return fmt.Errorf("on-link route to %s: %w", gw, err)
		}
		if err := ch.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
			return fmt.Errorf("default route via %s: %w", gw, err)
		}
	}
	return nil
}

// readAttachment reads eth0's global addresses back from a container
// namespace (used to adopt live containers after an agent restart).
func readAttachment(path string, p *plan) (a4, a6 netip.Addr, err error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return a4, a6, err
	}
	defer ns.Close()
	ch, err := netlink.NewHandleAt(ns)
	if err != nil {
		return a4, a6, err
	}
	defer ch.Close()
	l, err := ch.LinkByName("eth0")
	if err != nil {
		return a4, a6, err
	}
	addrs, err := ch.AddrList(l, netlink.FAMILY_ALL)
	for try := 0; errors.Is(err, netlink.ErrDumpInterrupted) && try < 10; try++ {
		addrs, err = ch.AddrList(l, netlink.FAMILY_ALL)
	}
	if err != nil {
		return a4, a6, err
	}
	for _, ad := range addrs {
		a, ok := netip.AddrFromSlice(ad.IP)
		if !ok {
			continue
		}
		a = a.Unmap()
		switch {
		case p.v4.Contains(a):
			a4 = a
		case p.v6.Contains(a):
			a6 = a
		}
	}
	if !a4.IsValid() || !a6.IsValid() {
		return a4, a6, fmt.Errorf("eth0 in %s has no address in the container subnets", path)
	}
	return a4, a6, nil
}
