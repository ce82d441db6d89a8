package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/agent"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image/build"
)

// TestRunscPoolAgentInRootNamespace runs tasks on a runsc pool whose agent
// runs in the host's root network namespace, as `make up` runs it (the
// other end-to-end machines live in namespaces of their own). The task must
// run under gVisor with its own network namespace on the agent's bridge and
// reach a host service through it, and the sandbox's probe battery must
// give what sandbox/testdata/probes.tsv expects of runsc under the default
// security (hardened, seccomp enforce, no NET_RAW). Debian's 2022 runsc
// refuses ("cannot run with network enabled in root network namespace") on
// 6.x kernels; the pinned build `make deps` installs
// (packaging/dev/runsc.sh) runs it.
func TestRunscPoolAgentInRootNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runsc")
	testenv.RequireBinary(t, "iptables")
	var registry string
	w := setupJoinWorldWith(t, func(c *config.Config) {
		if c.Worker.Pools == nil {
			c.Worker.Pools = map[string]config.Pool{}
		}
		c.Worker.Pools["gvisor"] = config.Pool{Runtime: "runsc"}
		reg, err := devstack.StartRegistry(context.Background(), filepath.Join(t.TempDir(), "registry"), c.Controlplane.PublicHost, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = reg.Stop() })
		registry = reg.Addr()
		res, err := build.BuildBusybox(context.Background(), reg.Addr(), "levers9/demo", "e2e", probeFiles(t), build.Options{Insecure: true})
		if err != nil {
			t.Fatal(err)
		}
		c.Worker.DefaultImage = res.Ref
	})
	ha := startHostAgent(t, w, "gvisor", registry)
	root, v4 := ha.root, ha.subnetV4
	var inv struct {
		Machines []struct {
			State     string `json:"state"`
			Inventory struct {
				Kernel       string `json:"kernel"`
				RunscVersion string `json:"runscVersion"`
			} `json:"inventory"`
		} `json:"machines"`
	}
	controlplanetest.Eventually(t, 60*time.Second, "the host agent online with its inventory", func() bool {
		w.cliJSON(t, &inv, "machine", "list")
		return len(inv.Machines) == 1 && inv.Machines[0].State == "MACHINE_STATE_ONLINE" && inv.Machines[0].Inventory.Kernel != ""
	})
	// The inventory names the runsc the agent runs: the pinned one.
	mod, err := os.ReadFile(filepath.Join("..", "..", "packaging", "runsc", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var pinned string
	if m := regexp.MustCompile(`gvisor\.dev/gvisor (v\S+)`).FindSubmatch(mod); m != nil {
		pinned = string(m[1])
	}
	if got := inv.Machines[0].Inventory.RunscVersion; pinned == "" || got != pinned {
		t.Errorf("runsc version in the inventory %q, want the pinned %q (packaging/dev/runsc.sh installs it)", got, pinned)
	}
	hostVersion, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}

	// Inside: gVisor's kernel (its /proc/version, not the host's), an eth0
	// with an address of the agent's subnet, and the controlplane (the
	// one host service a container may always reach) over it.
	cpHost, cpPort, _ := strings.Cut(w.in.Server.GRPCAddr(), ":")
	script := `set -e
cat /proc/version
grep -q 'eth0:' /proc/net/dev && echo has-eth0
ip -4 addr show eth0
nc -w 10 ` + cpHost + ` ` + cpPort + ` -e true && echo reached-controlplane`
	r := exec.Command(filepath.Join(bin, "levers9"), "run", "--pool", "gvisor", "--", "sh", "-c", script)
	r.Env = append(r.Environ(), "LEVERS9_HOME="+w.home)
	var so, se testenv.SyncBuffer
	r.Stdout, r.Stderr = &so, &se
	done := make(chan error, 1)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- r.Wait() }()
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		_ = r.Process.Kill()
		t.Fatalf("levers9 run did not exit within 3m\nstdout:\n%s\nstderr:\n%s", so.String(), se.String())
	}
	stdout := so.String()
	t.Logf("task output:\n%s", stdout)
	prefix := strings.Join(strings.Split(v4, ".")[:3], ".") + "."
	if err != nil || strings.Contains(stdout, strings.TrimSpace(string(hostVersion))) || !strings.Contains(stdout, "has-eth0") ||
		!strings.Contains(stdout, "inet "+prefix) || !strings.Contains(stdout, "reached-controlplane") {
		t.Fatalf("levers9 run on the runsc pool: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, se.String())
	}

	// The probe battery the sandbox tests run, now through `levers9 run`.
	t.Run("probes", func(t *testing.T) {
		r := exec.Command(filepath.Join(bin, "levers9"), "run", "--pool", "gvisor", "--", "/probe")
		r.Env = append(r.Environ(), "LEVERS9_HOME="+w.home)
		out, err := r.Output()
		if err != nil {
			t.Fatalf("levers9 run /probe: %v\n%s", err, out)
		}
		want := probeExpectations(t, "runsc/hardened/enforce")
		got := map[string]string{}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.SplitN(line, " ", 4); len(f) >= 3 && f[0] == "PROBE" {
				got[f[1]] = f[2]
			}
		}
		if len(want) < 25 {
			t.Fatalf("only %d probes expected", len(want))
		}
		for name, w := range want {
			if got[name] != w {
				t.Errorf("probe %s: %q, want %q", name, got[name], w)
			}
		}
		if t.Failed() {
			t.Logf("probe output:\n%s", out)
		}
	})
	t.Run("applied security", func(t *testing.T) { checkRunscApplied(t, w, root) })
}

// hostAgent is a machine whose agent runs in the host's root network
// namespace.
type hostAgent struct {
	id string
	// root holds the agent's state, etc and bin directories.
	root string
	// subnetV4 is its bridge's IPv4 subnet.
	subnetV4 string
}

// startHostAgent creates a machine of pool and runs its agent in the host's
// root network namespace, as `make up` runs it (the other end-to-end
// machines live in namespaces of their own), until the test ends.
func startHostAgent(t *testing.T, w *joinWorld, pool, registry string) hostAgent {
	t.Helper()
	out, errOut, err := w.cli(t, "machine", "create", "--pool", pool, "--name", "host")
	if err != nil {
		t.Fatalf("machine create: %v %s", err, errOut)
	}
	id := regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)[1]

	// The agent's bridge gets subnets, and its egress log a netlink group,
	// no other agent on this host uses (a `make up` agent has the defaults).
	n, _ := rand.Int(rand.Reader, big.NewInt(16*256)) // three hex digits in the v6 prefix below
	v4 := fmt.Sprintf("10.%d.%d.0/24", 230+n.Int64()/256, n.Int64()%256)
	v6 := fmt.Sprintf("fd6c:7639:9%03x::/64", n.Int64())
	nflog := fmt.Sprint(40000 + n.Int64())
	root := t.TempDir()
	agentOut := &testenv.SyncBuffer{}
	cmd := exec.Command("sh", filepath.Join(w.home, "machines", id+".sh"), "--foreground",
		"--state-dir", filepath.Join(root, "state"), "--etc-dir", filepath.Join(root, "etc"), "--bin-dir", filepath.Join(root, "bin"),
		"--", "--insecure-registries", registry, "--subnet-v4", v4, "--subnet-v6", v6, "--nflog-group", nflog)
	cmd.Stdout, cmd.Stderr = agentOut, agentOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The agent leaves its bridge and chains for the next agent; this one
	// has none, so take them out of the host's namespace (runs after the
	// agent stopped).
	t.Cleanup(func() {
		n, err := egress.NewNode(egress.Config{Prefix: agent.NodeConfig{MachineID: id}.WithDefaults().Prefix,
			SubnetV4: v4, SubnetV6: v6, Resolvers: []string{"192.0.2.53"}, StateDir: filepath.Join(root, "state", "network")}, nil, nil)
		if err == nil {
			err = n.Uninstall(context.Background())
		}
		if err != nil {
			t.Errorf("remove the agent's network: %v", err)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent output:\n%s", agentOut.String())
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	return hostAgent{id: id, root: root, subnetV4: v4}
}

// probeFiles is the sandbox's probe (sandbox/internal/probe) as /probe and
// a setuid-root /suidprobe, as its tests lay them out.
func probeFiles(t *testing.T) []build.File {
	t.Helper()
	out := filepath.Join(t.TempDir(), "probe")
	cmd := exec.Command("go", "build", "-o", out, "./sandbox/internal/probe")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return []build.File{{Path: "probe", Mode: 0o755, Data: data}, {Path: "suidprobe", Mode: 0o4755, Data: data}}
}

// probeExpectations is one column of sandbox/testdata/probes.tsv: probe
// name to allowed or blocked.
func probeExpectations(t *testing.T, column string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "sandbox", "testdata", "probes.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	col := -1
	want := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "\t")
		if col < 0 {
			col = slices.Index(f, column)
			if col < 0 {
				t.Fatalf("probes.tsv has no column %s", column)
			}
			continue
		}
		if col < len(f) {
			want[f[0]] = f[col]
		}
	}
	return want
}
