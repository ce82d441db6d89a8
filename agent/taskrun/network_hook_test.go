package taskrun

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox"
)

// newEgressNode makes a network namespace standing in for the host (the
// bridge and the rules live there, so nothing touches the real host's
// network) and a set-up egress node in it. Everything is removed at
// cleanup; namespaces a killed run left (l9r*, older than 10 minutes) are
// removed first.
func newEgressNode(t *testing.T) *egress.Node {
	t.Helper()
	return newEgressNodeIn(t, t.TempDir())
}

// newEgressNodeIn is newEgressNode with its state (the containers'
// resolv.conf files) under stateDir.
func newEgressNodeIn(t *testing.T, stateDir string) *egress.Node {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "ip", "iptables", "ip6tables", "iptables-restore", "ip6tables-restore")
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if info, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), testPrefix) && time.Since(info.ModTime()) > 10*time.Minute {
			_ = exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
	rb := make([]byte, 2)
	if _, err := rand.Read(rb); err != nil {
		t.Fatal(err)
	}
	prefix := testPrefix + hex.EncodeToString(rb)
	nodeNS := prefix + "-node"
	if out, err := exec.Command("ip", "netns", "add", nodeNS).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", nodeNS).Run() })
	node, err := egress.NewNode(egress.Config{
		Prefix:          prefix,
		Security:        egress.SecurityConfig{BridgePortIsolation: true, Egress: egress.EgressConfig{Mode: egress.ModeEnforce}},
		SubnetV4:        "10.209.0.0/24",
		SubnetV6:        "fd6c:7639:9000::/64",
		Resolvers:       []string{"192.0.2.53"},
		Controlplane:    []string{"10.250.0.5:1995/tcp"},
		NodeNetns:       filepath.Join("/run/netns", nodeNS),
		StateDir:        stateDir,
		CollectInterval: time.Hour,
	}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := node.Setup(ctx); err != nil {
		t.Fatalf("egress setup: %v", err)
	}
	t.Cleanup(func() {
		if err := node.Uninstall(context.Background()); err != nil {
			t.Errorf("egress uninstall: %v", err)
		}
	})
	return node
}

// TestNetworkHookAttachesEgress runs a task on a real egress node: it gets
// an address in the node's subnet and the node's resolv.conf, and its
// namespace is gone afterwards.
func TestNetworkHookAttachesEgress(t *testing.T) {
	node := newEgressNode(t)
	b := setup(t, setupOpts{cfg: func(c *Config) { c.Egress = node }})
	tk := b.task("net", "cat /etc/resolv.conf; ip -4 -o addr show dev eth0")
	var rec recorder
	res, err := b.runner.Run(testCtx(t), tk, rec.output())
	if err != nil || res.State != StateSucceeded {
		t.Fatalf("Run = %s, %v; output %q %q", res.State, err, rec.texts(Stdout), rec.texts(Stderr))
	}
	out := strings.Join(rec.texts(Stdout), "\n")
	if !strings.Contains(out, "nameserver 192.0.2.53") {
		t.Errorf("resolv.conf not the node's: %q", out)
	}
	var addr netip.Addr
	for _, f := range strings.Fields(out) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Addr().Is4() {
			addr = p.Addr()
		}
	}
	if !netip.MustParsePrefix("10.209.0.0/24").Contains(addr) {
		t.Errorf("container address %v not in the node's subnet; output %q", addr, out)
	}
	cid := b.sb.ContainerID(tk.runID())
	if _, ok := node.Attached(cid); ok {
		t.Errorf("container %s still attached after the run", cid)
	}
	b.assertClean(t, tk)
}

// TestNetworkHookIdempotent: a second Prestart keeps the attachment, Stop
// twice is fine, and without a node the hook does nothing.
func TestNetworkHookIdempotent(t *testing.T) {
	ctx := context.Background()
	req := &PrestartRequest{Task: Task{ID: "idem", Attempt: 1, Pool: "default"}, ContainerID: "l9r-idem.1"}
	var none PrestartResponse
	nilHook := newNetworkHook(nil)
	if err := nilHook.Prestart(ctx, req, &none); err != nil || none.NetNSPath != "" || len(none.Mounts) != 0 {
		t.Fatalf("without a node: %+v, %v", none, err)
	}
	if err := nilHook.Stop(ctx, &StopRequest{ContainerID: req.ContainerID}); err != nil {
		t.Fatal(err)
	}
	h := newNetworkHook(newEgressNode(t))
	var first, second PrestartResponse
	if err := h.Prestart(ctx, req, &first); err != nil {
		t.Fatal(err)
	}
	if err := h.Prestart(ctx, req, &second); err != nil {
		t.Fatal(err)
	}
	if first.NetNSPath == "" || first.NetNSPath != second.NetNSPath || len(second.Mounts) != 1 || second.Mounts[0].Destination != "/etc/resolv.conf" {
		t.Fatalf("Prestart twice: %+v then %+v", first, second)
	}
	if _, err := os.Stat(first.NetNSPath); err != nil {
		t.Fatalf("namespace: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := h.Stop(ctx, &StopRequest{ContainerID: req.ContainerID}); err != nil {
			t.Fatalf("Stop %d: %v", i, err)
		}
	}
	if _, err := os.Stat(first.NetNSPath); !os.IsNotExist(err) {
		t.Errorf("namespace %s left after Stop: %v", first.NetNSPath, err)
	}
}

// TestAgentMountsNotJudged runs a task that asks for no volume on a node
// laid out as the agent lays it out: the egress node's resolv.conf files
// live under the agent's state directory, which is a sensitive path. The
// resolv.conf the agent mounts itself is not a task's volume: log mode
// logs no warning for it, and enforce mode runs the task.
func TestAgentMountsNotJudged(t *testing.T) {
	agentState := t.TempDir()
	node := newEgressNodeIn(t, filepath.Join(agentState, "network"))
	for _, mode := range []sandbox.MountValidation{sandbox.MountValidationLog, sandbox.MountValidationEnforce} {
		t.Run(string(mode), func(t *testing.T) {
			var logs warnings
			b := setup(t, setupOpts{cfg: func(c *Config) {
				host, err := sandbox.DetectHost(testCtx(t), sandbox.NVIDIADiscovery{})
				if err != nil {
					t.Fatal(err)
				}
				sb, err := sandbox.New(sandbox.Config{Prefix: testPrefix, StateDir: testStateDir, CgroupParent: testCgroup,
					Host: host, MountValidation: mode, SensitivePaths: []string{agentState}, Logger: slog.New(&logs)})
				if err != nil {
					t.Fatal(err)
				}
				c.Sandbox, c.Egress = sb, node
			}})
			tk := b.task("agentmounts-"+string(mode), "cat /etc/resolv.conf")
			var rec recorder
			res, err := b.runner.Run(testCtx(t), tk, rec.output())
			if err != nil || res.State != StateSucceeded {
				t.Fatalf("Run = %s, %v; output %q %q", res.State, err, rec.texts(Stdout), rec.texts(Stderr))
			}
			if !strings.Contains(strings.Join(rec.texts(Stdout), "\n"), "nameserver 192.0.2.53") {
				t.Errorf("resolv.conf not mounted: %q", rec.texts(Stdout))
			}
			if got := logs.messages(); len(got) != 0 {
				t.Errorf("a task without volumes logged warnings: %q", got)
			}
		})
	}
}

// warnings is a slog handler that keeps the messages of warnings and
// errors.
type warnings struct {
	// mu guards msgs.
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnings) WithGroup(string) slog.Handler                { return w }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}

func (w *warnings) messages() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}
