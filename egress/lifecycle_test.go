package egress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/levers9/levers9/internal/testenv"
)

func metadataHits(t *testing.T, nb *nodeBundle, ns string, k int) {
	t.Helper()
	for i := 0; i < k; i++ {
		_, err := probe(ns, "tcp", "169.254.169.254:80")
		switch {
		case nb.node.Config().Security.Egress.Mode == ModeObserve && err != nil:
			t.Fatalf("observe: metadata probe: %v", err)
		case nb.node.Config().Security.Egress.Mode == ModeEnforce && !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EHOSTUNREACH):
			// Anything but the rule's rejection means the probe may not
			// have reached the chain, and the counts below would be off.
			t.Fatalf("enforce: metadata probe: %v, want a rejection", err)
		}
	}
}

func metadataCount(t *testing.T, nb *nodeBundle, task string) float64 {
	t.Helper()
	if err := nb.node.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	return testutil.ToFloat64(nb.node.matches.WithLabelValues("gpu", task, ClassMetadata))
}

// saveWithCounters returns the rules plus the counters of the container
// chains (the hooks' counters also count the node's own background
// traffic, so they are left out).
func saveWithCounters(t *testing.T, w *world) string {
	t.Helper()
	b := saveRules(t, w.nodeNS)
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		for _, l := range strings.Split(run(t, "ip", "netns", "exec", filepath.Base(w.nodeNS), bin, "-c"), "\n") {
			if strings.Contains(l, "-A "+w.prefix+"-c") {
				b += l + "\n"
			}
		}
	}
	return b
}

// hookTargets returns the first rule of each hooked built-in chain.
func firstRules(t *testing.T, w *world) []string {
	t.Helper()
	var out []string
	ns := filepath.Base(w.nodeNS)
	for _, bin := range []string{"iptables", "ip6tables"} {
		for _, tc := range [][2]string{{"filter", "FORWARD"}, {"filter", "INPUT"}, {"nat", "POSTROUTING"}} {
			lines := strings.Split(run(t, "ip", "netns", "exec", ns, bin, "-t", tc[0], "-S", tc[1]), "\n")
			if len(lines) < 2 {
				out = append(out, "")
				continue
			}
			out = append(out, bin+" "+lines[1])
		}
	}
	return out
}

func TestApplyTwiceChangesNothing(t *testing.T) {
	w := newWorld(t)
	nb := setupNode(t, w, w.config(ModeObserve))
	metadataHits(t, nb, nb.a.NetnsPath, 3)
	before := saveWithCounters(t, w)
	ctx := context.Background()
	if err := nb.node.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := nb.node.Reconcile(ctx, []ContainerNet{{ID: "ctr-a", Task: "task-a", Pool: "gpu"}, {ID: "ctr-b", Task: "task-b", Pool: "gpu"}}); err != nil {
		t.Fatal(err)
	}
	if after := saveWithCounters(t, w); after != before {
		t.Errorf("re-apply changed the rules or counters:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if got := metadataCount(t, nb, "task-a"); got != 3 {
		t.Errorf("metadata count = %v, want 3", got)
	}
}

func TestRebuildKeepsCounters(t *testing.T) {
	w := newWorld(t)
	nb := setupNode(t, w, w.config(ModeEnforce))
	metadataHits(t, nb, nb.a.NetnsPath, 2)
	if got := metadataCount(t, nb, "task-a"); got != 2 {
		t.Fatalf("metadata count = %v, want 2", got)
	}
	gen := firstRules(t, w)[0]
	chainA := ctrChain(t, w, "ctr-a")
	ctx := context.Background()
	if _, err := nb.node.AddContainer(ctx, ContainerNet{ID: "ctr-c", Task: "task-c", Pool: "gpu"}); err != nil {
		t.Fatal(err)
	}
	if g := firstRules(t, w)[0]; g == gen {
		t.Fatalf("adding a container did not swap the dispatch chain: %s", g)
	}
	if c := ctrChain(t, w, "ctr-a"); c != chainA {
		t.Errorf("adding a container rebuilt a's chain: %s -> %s", chainA, c)
	}
	if got := metadataCount(t, nb, "task-a"); got != 2 {
		t.Errorf("after swap: metadata count = %v, want 2", got)
	}
	metadataHits(t, nb, nb.a.NetnsPath, 1)
	if err := nb.node.RemoveContainer(ctx, "ctr-c"); err != nil {
		t.Fatal(err)
	}
	if got := metadataCount(t, nb, "task-a"); got != 3 {
		t.Errorf("after two swaps: metadata count = %v, want 3", got)
	}
	// A policy change rebuilds a's own chain: its counts are carried
	// over from the retired chain, not lost and not doubled.
	before := ctrChain(t, w, "ctr-a")
	strict := &SecurityConfig{BridgePortIsolation: true, Egress: EgressConfig{Mode: ModeEnforce, Allow: []string{"192.0.2.0/24"}}}
	live := []ContainerNet{{ID: "ctr-a", Task: "task-a", Pool: "gpu", Security: strict}, {ID: "ctr-b", Task: "task-b", Pool: "gpu"}}
	if err := nb.node.Reconcile(ctx, live); err != nil {
		t.Fatal(err)
	}
	if after := ctrChain(t, w, "ctr-a"); after == before {
		t.Fatalf("policy change kept chain %s", after)
	}
	if got := metadataCount(t, nb, "task-a"); got != 3 {
		t.Errorf("after a's chain was rebuilt: metadata count = %v, want 3", got)
	}
	metadataHits(t, nb, nb.a.NetnsPath, 2)
	if got := metadataCount(t, nb, "task-a"); got != 5 {
		t.Errorf("after more hits: metadata count = %v, want 5", got)
	}
}

// ctrChain returns the name of a container's IPv4 chain.
func ctrChain(t *testing.T, w *world, id string) string {
	t.Helper()
	out := run(t, "ip", "netns", "exec", filepath.Base(w.nodeNS), "iptables", "-S")
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if n, ok := strings.CutPrefix(l, "-N "+w.prefix+"-c"+keyOf(id)+"-"); ok {
			names = append(names, n)
		}
	}
	if len(names) != 1 {
		t.Fatalf("chains of %s: %v", id, names)
	}
	return names[0]
}

func TestHooksReturnToFront(t *testing.T) {
	w := newWorld(t)
	cfg := w.config(ModeEnforce)
	cfg.CollectInterval = 200 * time.Millisecond
	nb := setupNode(t, w, cfg)
	ns := filepath.Base(w.nodeNS)
	// Another program (Docker, say) inserts in front of us.
	for _, bin := range []string{"iptables", "ip6tables"} {
		src := "192.0.2.99/32"
		if bin == "ip6tables" {
			src = "2001:db8:99::/128"
		}
		for _, tc := range [][2]string{{"filter", "FORWARD"}, {"filter", "INPUT"}, {"nat", "POSTROUTING"}} {
			run(t, "ip", "netns", "exec", ns, bin, "-t", tc[0], "-I", tc[1], "1", "-s", src, "-j", "RETURN")
		}
	}
	// The agent's loop (every 200ms here) puts our hooks back in front
	// and says so.
	testenv.Eventually(t, 10*time.Second, "hooks back at position 1", func() bool {
		for _, r := range firstRules(t, w) {
			if !strings.Contains(r, w.prefix+" egress") {
				return false
			}
		}
		return true
	})
	testenv.Eventually(t, 5*time.Second, "log line about moved hooks", func() bool {
		return nb.logs.find("egress hooks were not first in their chains; moved back to position 1", nil)
	})
	// Still enforcing, and the foreign rules are untouched.
	if _, err := probe(nb.a.NetnsPath, "tcp", "169.254.169.254:80"); err == nil {
		t.Error("metadata reachable after hook move")
	}
	if out := run(t, "ip", "netns", "exec", ns, "iptables", "-S", "FORWARD"); !strings.Contains(out, "192.0.2.99/32 -j RETURN") {
		t.Errorf("foreign rule gone:\n%s", out)
	}
}

func TestUninstallLeavesNothing(t *testing.T) {
	w := newWorld(t)
	pristine := saveRules(t, w.nodeNS)
	ctx := context.Background()
	n, err := NewNode(w.config(ModeEnforce, "192.168.77.10:8080/tcp"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := n.AddContainer(ctx, ContainerNet{ID: "ctr-a", Task: "task-a", Pool: "gpu"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.AddContainer(ctx, ContainerNet{ID: "ctr-b", Task: "task-b", Pool: "gpu"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(a.ResolvConfPath); err != nil || !strings.Contains(string(b), "nameserver 192.0.2.53\nnameserver 2001:db8::53\n") {
		t.Errorf("resolv.conf = %q, %v", b, err)
	}
	if got := ourObjects(t, w); len(got) < 6 { // 2 netns, 2 veths, bridge, 2 state dirs
		t.Errorf("objects while running = %v", got)
	}
	if err := n.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ourObjects(t, w); len(got) != 0 {
		t.Errorf("left behind: %v", got)
	}
	if after := saveRules(t, w.nodeNS); after != pristine {
		t.Errorf("rules differ after uninstall:\nbefore:\n%s\nafter:\n%s", pristine, after)
	}
	if err := n.Uninstall(ctx); err != nil {
		t.Errorf("second uninstall: %v", err)
	}
}

func TestReconcileRemovesCrashLeftovers(t *testing.T) {
	w := newWorld(t)
	cfg := w.config(ModeEnforce)
	ctx := context.Background()
	crashed, err := NewNode(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := crashed.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := crashed.AddContainer(ctx, ContainerNet{ID: "ctr-a", Task: "task-a", Pool: "gpu"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.AddContainer(ctx, ContainerNet{ID: "ctr-b", Task: "task-b", Pool: "gpu"}); err != nil {
		t.Fatal(err)
	}
	// The agent dies; a new one knows only ctr-a is still running.
	nb := &nodeBundle{w: w, logs: &logRecorder{}}
	nb.node, err = NewNode(cfg, slogNew(nb.logs), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nb.node.Uninstall(context.Background()) })
	if err := nb.node.Reconcile(ctx, []ContainerNet{{ID: "ctr-a", Task: "task-a", Pool: "gpu"}}); err != nil {
		t.Fatal(err)
	}
	objs := strings.Join(ourObjects(t, w), " ")
	if strings.Contains(objs, keyOf("ctr-b")[:6]) {
		t.Errorf("ctr-b's objects survived reconcile: %s", objs)
	}
	if !strings.Contains(objs, keyOf("ctr-a")) {
		t.Errorf("ctr-a's objects removed: %s", objs)
	}
	// ctr-a was adopted: its rules are in place and attributed.
	if reply, err := probe(a.NetnsPath, "tcp", "203.0.113.10:80"); err != nil || !strings.HasPrefix(reply, "ok") {
		t.Errorf("adopted container cannot reach public: %q %v", reply, err)
	}
	metadataHits(t, nb, a.NetnsPath, 1)
	if got := metadataCount(t, nb, "task-a"); got != 1 {
		t.Errorf("adopted container metadata count = %v, want 1", got)
	}
	if att, ok := nb.node.Attached("ctr-a"); !ok || *att != *a {
		t.Errorf("Attached(ctr-a) = %+v, %v; want %+v", att, ok, a)
	}
	if _, ok := nb.node.Attached("ctr-b"); ok {
		t.Error("ctr-b still attached")
	}
	if att, err := nb.node.AddContainer(ctx, ContainerNet{ID: "ctr-a", Task: "task-a", Pool: "gpu"}); err != nil || att.IPv4 != a.IPv4 {
		t.Errorf("re-adding adopted container: %+v, %v", att, err)
	}
}

func TestKilledMidApplyConverges(t *testing.T) {
	w := newWorld(t)
	pristine := saveRules(t, w.nodeNS)
	cfg := w.config(ModeEnforce).WithDefaults()
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The reference: what a clean agent with no containers installs.
	ref, err := NewNode(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	want := saveRules(t, w.nodeNS)
	if err := ref.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 3; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+string(js))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("child: %q %v", line, err)
		}
		// A random delay is the scenario: it lands the kill somewhere in
		// the child's apply loop.
		<-time.After(time.Duration(rand.IntN(400)) * time.Millisecond)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()

		// The killed agent always had a container attached, so there
		// is something to clean up.
		if objs := ourObjects(t, w); len(objs) < 3 {
			t.Errorf("round %d: the killed child left too little to test with: %v", round, objs)
		}
		n, err := NewNode(cfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Reconcile(ctx, nil); err != nil {
			t.Fatalf("round %d: reconcile after kill: %v", round, err)
		}
		if got := saveRules(t, w.nodeNS); got != want {
			t.Errorf("round %d: after kill and reconcile:\n%s\nwant:\n%s", round, got, want)
		}
		if objs := ourObjects(t, w); len(objs) != 1 || objs[0] != "link "+w.prefix+"br" {
			t.Errorf("round %d: objects after reconcile: %v", round, objs)
		}
		if err := n.Uninstall(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := saveRules(t, w.nodeNS); got != pristine {
		t.Errorf("not pristine after uninstall:\n%s", got)
	}
}

// TestApplyRetriesAStaleRead: a chain of ours that goes away between
// apply's read and its restore (a killed agent's restore committing late)
// makes that restore fail; apply reads again and converges instead of
// failing.
func TestApplyRetriesAStaleRead(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	n, err := NewNode(w.config(ModeEnforce), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Uninstall(ctx) })
	x := n.ipts[0]
	ipt := func(args ...string) {
		run(t, append([]string{"ip", "netns", "exec", filepath.Base(w.nodeNS), map[family]string{v4: "iptables", v6: "ip6tables"}[x.fam]}, args...)...)
	}
	// Unhooked, so apply deletes it; it is gone before that restore runs.
	garbage := w.prefix + "-F-abcdef"
	ipt("-N", garbage)
	restores := 0
	x.beforeRestore = func() {
		restores++
		if restores == 1 {
			ipt("-X", garbage)
		}
	}
	err = n.ns.do(func() error {
		_, err := x.apply(ctx, buildRules(n.plan, x.fam, nil))
		return err
	})
	if err != nil {
		t.Fatalf("apply after a stale read: %v (restores: %d)", err, restores)
	}
	if restores != 1 {
		t.Errorf("%d restores, want 1 (the failed one; the second read finds nothing to change)", restores)
	}
	if got := saveRules(t, w.nodeNS); strings.Contains(got, garbage) {
		t.Errorf("%s still installed:\n%s", garbage, got)
	}
}
