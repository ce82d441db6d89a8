package egress

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/levers9/levers9/internal/procstat"
)

// agentProc is a process standing in for another agent: alive until kill.
func agentProc(t *testing.T, w *world, prefix string) (Owner, func()) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	t.Cleanup(kill)
	start, err := pidStart(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netnsID(w.nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	return Owner{Prefix: prefix, MachineID: "m_" + prefix, StateDir: t.TempDir(), PID: cmd.Process.Pid, PIDStart: start, Netns: ns}, kill
}

// claimedNode starts a node on a claim with one container in pool "cpu".
func claimedNode(t *testing.T, w *world, c HostClaim) *nodeBundle {
	t.Helper()
	cfg := w.config(ModeObserve)
	cfg.Prefix, cfg.SubnetV4, cfg.SubnetV6, cfg.NFLOGGroup = c.Owner.Prefix, c.SubnetV4, c.SubnetV6, c.NFLOGGroup
	cfg.StateDir = t.TempDir()
	ctx := context.Background()
	nb := &nodeBundle{w: w, reg: prometheus.NewRegistry(), logs: &logRecorder{}}
	n, err := NewNode(cfg, slogNew(nb.logs), nb.reg)
	if err != nil {
		t.Fatal(err)
	}
	nb.node = n
	t.Cleanup(func() { n.Stop(); _ = n.Uninstall(context.Background()) })
	if err := n.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if nb.a, err = n.AddContainer(ctx, ContainerNet{ID: "ctr-" + c.Owner.Prefix, Task: "task-" + c.Owner.Prefix, Pool: "gpu"}); err != nil {
		t.Fatal(err)
	}
	return nb
}

func hasLink(t *testing.T, w *world, name string) bool {
	t.Helper()
	return strings.Contains(run(t, "ip", "-n", strings.TrimPrefix(w.nodeNS, netnsDir+"/"), "-o", "link", "show"), " "+name+":")
}

// reachesHostAndWorld checks a container reaches the node itself and,
// through NAT, a listener in the world namespace (the internet).
func reachesHostAndWorld(t *testing.T, who string, a *Attachment) {
	t.Helper()
	if got, err := probe(a.NetnsPath, "tcp", net.JoinHostPort(nodeUplink4, nodePort)); err != nil || !strings.HasPrefix(got, "ok") {
		t.Errorf("%s: container %s cannot reach the host: %q %v", who, a.IPv4, got, err)
	}
	if got, err := probe(a.NetnsPath, "tcp", "203.0.113.10:80"); err != nil || !strings.HasPrefix(got, "ok") {
		t.Errorf("%s: container %s cannot reach the internet (NAT): %q %v", who, a.IPv4, got, err)
	}
}

// TestStaleBridgeMakesReportBlind: a bridge another agent left with the
// same subnet takes the route, so the second agent's containers reach
// nothing; its readiness report must not say "safe to enforce".
func TestStaleBridgeMakesReportBlind(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	staleCfg := w.config(ModeObserve)
	staleCfg.Prefix = w.prefix + "s"
	stale, err := NewNode(staleCfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stale.Uninstall(context.Background()) })
	if err := stale.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := w.config(ModeObserve)
	cfg.Prefix = w.prefix + "n"
	cfg.StateDir = t.TempDir()
	n, err := NewNode(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Uninstall(context.Background()) })
	if err := n.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := n.AddContainer(ctx, ContainerNet{ID: "ctr-x", Task: "task-x", Pool: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := probe(a.NetnsPath, "tcp", net.JoinHostPort(nodeUplink4, nodePort)); err == nil {
		t.Logf("with the stale bridge the host answered %q (expected the reply to go astray)", got)
	}
	rep := n.ReadinessReport("cpu")
	if rep.SafeToEnforce || !strings.Contains(rep.Blind, staleCfg.Prefix+"br") {
		t.Fatalf("with a stale bridge on the same subnet: safe=%v blind=%q; want not safe, blind naming %sbr", rep.SafeToEnforce, rep.Blind, staleCfg.Prefix)
	}
	if !strings.Contains(rep.Text(), "safe to enforce: unknown") {
		t.Errorf("report text does not say unknown:\n%s", rep.Text())
	}
	if err := stale.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	if rep := n.ReadinessReport("cpu"); !rep.SafeToEnforce || rep.Blind != "" {
		t.Errorf("without the stale bridge: safe=%v blind=%q", rep.SafeToEnforce, rep.Blind)
	}
	reachesHostAndWorld(t, "after the stale bridge went", a)
}

// TestSecondNodeSameNFLOGGroup: a second node on a bound group says so in
// one sentence.
func TestSecondNodeSameNFLOGGroup(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	first, err := NewNode(w.config(ModeObserve), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer first.Stop()
	cfg := w.config(ModeObserve)
	cfg.Prefix = w.prefix + "2"
	second, err := NewNode(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = second.Start(ctx)
	if err == nil {
		second.Stop()
		t.Fatal("a second node started on a bound NFLOG group")
	}
	if msg := err.Error(); !strings.Contains(msg, "NFLOG group 1993 is already bound by another program") || strings.Contains(msg, "operation not permitted") {
		t.Errorf("error %q, want one sentence saying the group is taken", msg)
	}
}

// TestHostClaims: agents on one host get their own subnets and NFLOG
// groups; a dead agent's bridge and chains go at the next claim, a live
// one's stay; tasks of both live nodes reach the host and NAT out, and
// observe-mode matches are counted per node.
func TestHostClaims(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	// A host route inside the pool's first slot: claims skip it.
	run(t, "ip", "-n", strings.TrimPrefix(w.nodeNS, netnsDir+"/"), "route", "add", "10.208.1.0/24", "via", "198.18.0.2")
	hc := HostConfig{Dir: t.TempDir(), NodeNetns: w.nodeNS}

	deadOwner, kill := agentProc(t, w, w.prefix+"d")
	dead, err := ClaimHost(ctx, hc, deadOwner, Want{})
	if err != nil {
		t.Fatal(err)
	}
	if dead.SubnetV4 != "10.208.4.0/22" || dead.NFLOGGroup != DefaultNFLOGFirst {
		t.Errorf("first claim %+v, want 10.208.4.0/22 (10.208.0.0/22 has a host route) and group %d", dead, DefaultNFLOGFirst)
	}
	deadNode := claimedNode(t, w, dead)
	deadNode.node.Stop() // the agent dies, its bridge and chains stay
	kill()

	liveOwner, _ := agentProc(t, w, w.prefix+"l")
	live, err := ClaimHost(ctx, hc, liveOwner, Want{})
	if err != nil {
		t.Fatal(err)
	}
	if hasLink(t, w, deadOwner.Prefix+"br") {
		t.Errorf("the dead agent's bridge %sbr is still there after the next claim", deadOwner.Prefix)
	}
	if out := run(t, "ip", "netns", "exec", strings.TrimPrefix(w.nodeNS, netnsDir+"/"), "iptables-save"); strings.Contains(out, deadOwner.Prefix+"-") {
		t.Errorf("the dead agent's chains are still there:\n%s", out)
	}
	liveNode := claimedNode(t, w, live)

	me, err := SelfOwner(w.prefix+"m", "m_me", t.TempDir(), w.nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := ClaimHost(ctx, hc, me, Want{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasLink(t, w, liveOwner.Prefix+"br") {
		t.Errorf("a live agent's bridge was removed")
	}
	if mine.SubnetV4 == live.SubnetV4 || mine.SubnetV6 == live.SubnetV6 || mine.NFLOGGroup == live.NFLOGGroup {
		t.Errorf("claims overlap: live %+v, mine %+v", live, mine)
	}
	// The same agent again (a restart) keeps its claim.
	again, err := ClaimHost(ctx, hc, me, Want{})
	if err != nil || again.SubnetV4 != mine.SubnetV4 || again.NFLOGGroup != mine.NFLOGGroup {
		t.Errorf("reclaim: %+v %v, want %+v", again, err, mine)
	}
	// Explicit values that collide with a live agent are refused in one sentence.
	if _, err := ClaimHost(ctx, hc, me, Want{NFLOGGroup: live.NFLOGGroup}); err == nil || !strings.Contains(err.Error(), "held by a running agent") {
		t.Errorf("explicit taken NFLOG group: %v", err)
	}
	myNode := claimedNode(t, w, mine)

	for _, nb := range []*nodeBundle{liveNode, myNode} {
		reachesHostAndWorld(t, nb.node.Config().Prefix, nb.a)
		if rep := nb.node.ReadinessReport("gpu"); rep.Blind != "" {
			t.Errorf("%s blind: %s", nb.node.Config().Prefix, rep.Blind)
		}
	}
	metadataHits(t, liveNode, liveNode.a.NetnsPath, 3)
	metadataHits(t, myNode, myNode.a.NetnsPath, 2)
	for _, c := range []struct {
		nb   *nodeBundle
		want float64
	}{{liveNode, 3}, {myNode, 2}} {
		if err := c.nb.node.Collect(ctx); err != nil {
			t.Fatal(err)
		}
		task := "task-" + c.nb.node.Config().Prefix
		if got := metadataCount(t, c.nb, task); got != c.want {
			t.Errorf("%s: metadata matches %v, want %v", task, got, c.want)
		}
	}
	claims, err := Claims(hc)
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 2 {
		t.Errorf("claims %+v, want the live agent's and mine", claims)
	}
	// make down: release both; their objects go.
	if err := ReleaseHost(ctx, hc, nil, true); err != nil {
		t.Fatal(err)
	}
	if hasLink(t, w, liveOwner.Prefix+"br") || hasLink(t, w, me.Prefix+"br") {
		t.Errorf("bridges left after ReleaseHost")
	}
	if claims, _ := Claims(hc); len(claims) != 0 {
		t.Errorf("claims left after ReleaseHost: %+v", claims)
	}
}

// TestKilledUnreapedAgentIsNotAlive: an agent killed with SIGKILL whose
// parent has not reaped it yet (a zombie) holds nothing, so its restart
// may take its claim back.
func TestKilledUnreapedAgentIsNotAlive(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	start, err := pidStart(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	o := Owner{PID: cmd.Process.Pid, PIDStart: start, StateDir: t.TempDir()}
	if !o.Alive() {
		t.Fatal("a running process is not alive")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st, _ := procstat.Read(o.PID); !st.Exited(); st, _ = procstat.Read(o.PID) {
		if time.Now().After(deadline) {
			t.Fatal("the killed process never became a zombie")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if o.Alive() {
		t.Fatal("a killed, unreaped process counts as a live agent")
	}
}
