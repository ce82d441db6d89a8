package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
)

// Collect reads the attributed rule counters of both families, adds what is
// new to worker_container_egress_matches_total and to the readiness report.
// Counts of chains retired by rebuilds were carried into a base when they
// were retired, so totals never go backwards across swaps.
func (n *Node) Collect(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	live := map[counterKey]uint64{}
	for _, x := range n.ipts {
		err := n.ns.do(func() error {
			counts, err := x.counters(ctx)
			if err != nil {
				return err
			}
			for k, v := range counts {
				live[k] += v
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("collect egress counters: %w", err)
		}
	}
	seen := map[counterKey]bool{}
	for k := range live {
		seen[k] = true
	}
	for k := range n.base {
		seen[k] = true
	}
	for k := range seen {
		total := n.base[k] + live[k]
		prev := n.exported[k]
		if total <= prev {
			continue
		}
		lb := n.labels[k.key]
		n.matches.WithLabelValues(lb.Pool, lb.Task, k.class).Add(float64(total - prev))
		n.readiness.AddCount(lb.Pool, lb.Task, k.class, total-prev)
		n.exported[k] = total
	}
	return nil
}

// ReadinessReport returns what the pool's containers on this node had
// refused (or would have, in observe mode) over the report window.
func (n *Node) ReadinessReport(pool string) Report {
	n.mu.Lock()
	mode, ok := n.poolModes[pool]
	n.mu.Unlock()
	if !ok {
		mode = n.plan.policy.mode
	}
	rep := n.readiness.Report(pool, mode)
	if rep.Blind = n.blind(); rep.Blind != "" {
		rep.SafeToEnforce = false
	}
	return rep
}

// blind says why the rule counters cannot see this node's containers'
// traffic, "" when they can: replies to a container address must route
// out this node's bridge. A bridge another agent left with the same
// subnet takes them (its route comes first), so containers reach neither
// the host nor the internet and a report of nothing refused means nothing.
func (n *Node) blind() string {
	n.mu.Lock()
	setup := n.setupDone
	n.mu.Unlock()
	if !setup {
		return "the container network is not set up"
	}
	h, err := n.ns.handle()
	if err != nil {
		return "cannot inspect the node's network: " + err.Error()
	}
	defer h.Close()
	bridge := names{n.plan.cfg.Prefix}.bridge()
	br, err := h.LinkByName(bridge)
	if err != nil {
		return fmt.Sprintf("bridge %s is missing", bridge)
	}
	for _, a := range []netip.Addr{n.plan.gw4.Next(), n.plan.gw6.Next()} {
		rs, err := h.RouteGet(net.IP(a.AsSlice()))
		if err != nil || len(rs) == 0 {
			return fmt.Sprintf("no route to container address %s", a)
		}
		if idx := rs[0].LinkIndex; idx != br.Attrs().Index {
			dev := strconv.Itoa(idx)
			if l, err := h.LinkByIndex(idx); err == nil {
				dev = l.Attrs().Name
			}
			return fmt.Sprintf("traffic to container address %s goes out %s, not this agent's bridge %s (another bridge holds subnet %s): containers cannot reach the host or the internet and the counters miss their traffic",
				a, dev, bridge, n.plan.v4)
		}
	}
	return ""
}

// handleMatch attributes a logged match to its container by source address,
// logs it (the kernel rule already rate-limits) and records the sample.
func (n *Node) handleMatch(m Match) {
	n.mu.Lock()
	key, ok := n.byAddr[m.Src]
	lb := n.labels[key]
	pol := n.plan.policy
	if c := n.ctrs[key]; c != nil {
		pol = c.pol
	}
	n.mu.Unlock()
	if !ok {
		n.log.Warn("egress match from an unknown source", "src", m.Src, "class", m.Class, "destination", m.Destination())
		return
	}
	allowed, suppressed := n.logLimit.allow(counterKey{key: key, class: m.Class})
	n.readiness.AddSample(lb.Pool, lb.Task, m.Class, m.Destination())
	if !allowed {
		return
	}
	verb := "would refuse"
	if pol.mode == ModeEnforce || m.Class == ClassContainer && pol.isolation {
		verb = "refused"
	}
	n.log.Info("egress "+verb, "container_id", lb.ID, "task_id", lb.Task, "pool", lb.Pool,
		"class", m.Class, "destination", m.Destination(), "mode", string(pol.mode), "suppressed", suppressed)
}

// Start begins reading the NFLOG group and, every CollectInterval, collects
// counters and re-applies the rules (which puts the hooks back at position
// 1 if another program inserted in front). It returns once started.
func (n *Node) Start(ctx context.Context) error {
	n.runMu.Lock()
	defer n.runMu.Unlock()
	if n.done != nil {
		return fmt.Errorf("egress node already started: %w", errdefs.ErrFailedPrecondition)
	}
	var conn *nflogConn
	err := n.ns.do(func() error {
		var err error
		conn, err = openNFLOG(n.plan.cfg.NFLOGGroup)
		return err
	})
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EBUSY) {
		return NFLOGTakenError(n.plan.cfg.NFLOGGroup)
	}
	if err != nil {
		return fmt.Errorf("start egress: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	n.cancel, n.done, n.conn = cancel, done, conn
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 1<<16)
		for {
			ms, err := conn.read(buf, n.plan.cfg.Prefix)
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, os.ErrClosed) {
					n.log.Error("reading egress log", "err", err)
				}
				return
			}
			for _, m := range ms {
				n.handleMatch(m)
			}
		}
	}()
	go func() {
		defer close(done)
		defer func() { <-readerDone }()
		t := time.NewTicker(n.plan.cfg.CollectInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := n.Collect(ctx); err != nil && !errdefs.IsCanceled(err) && ctx.Err() == nil {
				n.log.Warn("collecting egress counters", "err", err)
			}
			n.mu.Lock()
			err := error(nil)
			if n.setupDone {
				err = n.applyLocked(ctx)
			}
			n.mu.Unlock()
			if err != nil && ctx.Err() == nil {
				n.log.Warn("re-applying egress rules", "err", err)
			}
		}
	}()
	return nil
}

// Stop ends the loops and blocks until they are done. Safe twice and
// before Start.
func (n *Node) Stop() {
	n.runMu.Lock()
	defer n.runMu.Unlock()
	if n.done == nil {
		return
	}
	n.cancel()
	_ = n.conn.Close()
	<-n.done
	n.done, n.cancel, n.conn = nil, nil, nil
}
