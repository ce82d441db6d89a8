package egress

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/vishvananda/netlink"
)

var leftoverRE = regexp.MustCompile(`^[0-9a-f]{6,8}$`)

// Reconcile makes the node match live, the containers the agent knows to be
// running: it adopts live containers whose namespace survived, removes every
// namespace, veth, resolv.conf and chain of ours that belongs to no live
// container (what a crashed agent left), and puts the hooks back in front.
// A live container whose namespace is gone cannot be re-attached (its
// process holds an anonymous one); it is logged and not adopted, and
// Attached reports it missing, so the agent restarts it.
func (n *Node) Reconcile(ctx context.Context, live []ContainerNet) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.setupLocked(ctx); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	liveKeys := map[string]bool{}
	for _, cn := range live {
		key := keyOf(cn.ID)
		pol, err := n.policyFor(cn)
		if err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
		liveKeys[key] = true
		if c := n.ctrs[key]; c != nil {
			c.net, c.pol = cn, pol
			n.labels[key] = cn
			continue
		}
		nm := names{n.plan.cfg.Prefix}
		c := &container{net: cn, pol: pol, key: key, nsPath: filepath.Join(netnsDir, nm.netns(key)),
			resolvDir: filepath.Join(n.plan.cfg.StateDir, nm.netns(key))}
		a4, a6, err := readAttachment(c.nsPath, n.plan)
		if err != nil {
			n.log.Warn("live container has no usable namespace; it must be added again", "container_id", cn.ID, "task_id", cn.Task, "pool", cn.Pool, "err", err)
			liveKeys[key] = false
			continue
		}
		c.a4, c.a6 = a4, a6
		n.trackLocked(c)
	}
	for key, c := range n.ctrs {
		if !liveKeys[key] {
			n.untrackLocked(c)
		}
	}
	if err := n.applyLocked(ctx); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	if err := n.removeLeftovers(liveKeys); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	return nil
}

// removeLeftovers deletes host objects with our prefix whose key is not live.
func (n *Node) removeLeftovers(live map[string]bool) error {
	pre := n.plan.cfg.Prefix
	isLive := func(k string) bool {
		for lk, ok := range live {
			if ok && strings.HasPrefix(lk, k) {
				return true
			}
		}
		return false
	}
	var errs []error
	if ents, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range ents {
			if k, ok := strings.CutPrefix(e.Name(), pre+"-"); ok && leftoverRE.MatchString(k) && len(k) == 8 && !isLive(k) {
				if err := deleteNetns(e.Name()); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if ents, err := os.ReadDir(n.plan.cfg.StateDir); err == nil {
		for _, e := range ents {
			if k, ok := strings.CutPrefix(e.Name(), pre+"-"); ok && leftoverRE.MatchString(k) && len(k) == 8 && !isLive(k) {
				if err := os.RemoveAll(filepath.Join(n.plan.cfg.StateDir, e.Name())); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	h, err := n.ns.handle()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer h.Close()
	links, err := h.LinkList()
	for try := 0; errors.Is(err, netlink.ErrDumpInterrupted) && try < 10; try++ {
		links, err = h.LinkList()
	}
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list links: %w", err))...)
	}
	for _, l := range links {
		k, ok := strings.CutPrefix(l.Attrs().Name, pre+"v")
		if ok && len(k) == 6 && leftoverRE.MatchString(k) && l.Type() == "veth" && !isLive(k) {
			if err := h.LinkDel(l); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("delete veth %s: %w", l.Attrs().Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Uninstall removes every object of ours: containers' namespaces and veths,
// hooks and chains in both families, the bridge and the resolv.conf
// directories. Counts of removed chains stay in the metric.
func (n *Node) Uninstall(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.ctrs {
		n.untrackLocked(c)
	}
	var errs []error
	if err := n.removeLeftovers(nil); err != nil {
		errs = append(errs, err)
	}
	for _, f := range []family{v4, v6} {
		x, err := newIPT(f, n.plan.cfg.Prefix)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = n.ns.do(func() error {
			retired, err := x.uninstall(ctx)
			n.carry(retired)
			return err
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	if h, err := n.ns.handle(); err == nil {
		if l, err := h.LinkByName(names{n.plan.cfg.Prefix}.bridge()); err == nil {
			if err := h.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete bridge: %w", err))
			}
		}
		h.Close()
	} else {
		errs = append(errs, err)
	}
	n.setupDone = false
	if len(errs) > 0 {
		return fmt.Errorf("egress uninstall: %w", errors.Join(errs...))
	}
	return nil
}
