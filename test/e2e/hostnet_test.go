package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/levers9/levers9/agent"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/packaging/localstack"
	"github.com/levers9/levers9/sandbox/image/build"
)

// hostStack is one local stack as `make up` makes it: its own controlplane
// (own database), one machine joined by the join script, and its agent in
// the host's root network namespace with its own state directory.
type hostStack struct {
	*joinWorld
	id, prefix string
	root       string // the agent's state, etc and bin directories
	pid        int
	stop       func()
	out        *testenv.SyncBuffer
}

// hostNet is what TestHostNetworkAcrossStacks shares between its stacks:
// the image registry, the host-wide claims directory, a listener on the
// host and one in a namespace standing in for the internet.
type hostNet struct {
	registry, image string
	hostDir         string
	hostPort        int
	inetAddr        string // HOST:PORT of the "internet" listener
	inetGateway     string // the host's address on the link to it
}

// startStack starts a controlplane and joins one agent in the root
// namespace to its pool default (egress observe), as `make up` does.
func (h *hostNet) startStack(t *testing.T, name string) *hostStack {
	t.Helper()
	return h.startStackIn(t, name, h.hostDir)
}

// startStackIn is startStack with the agent's claims kept in hostDir (""
// for the host's, egress.DefaultHostDir, as `make up` keeps them).
func (h *hostNet) startStackIn(t *testing.T, name, hostDir string) *hostStack {
	t.Helper()
	w := setupJoinWorldWith(t, func(c *config.Config) {
		c.Worker.DefaultImage = h.image
		c.Worker.ContainerSecurity.Egress.Mode = "observe"
		// The agent's lease is a third of it, and it heartbeats (with its
		// readiness report) at least that often: every 3 s.
		c.Controlplane.LostAgentGrace = "9s"
	})
	out, errOut, err := w.cli(t, "machine", "create", "--pool", "default", "--name", name)
	if err != nil {
		t.Fatalf("machine create: %v %s", err, errOut)
	}
	id := regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)[1]
	s := &hostStack{joinWorld: w, id: id, prefix: agent.NodeConfig{MachineID: id}.WithDefaults().Prefix,
		root: filepath.Join(t.TempDir(), name), out: &testenv.SyncBuffer{}}
	// No --subnet-v4, --subnet-v6 or --nflog-group: the agent claims them
	// from the host allocator as a `make up` agent does.
	args := []string{filepath.Join(w.home, "machines", id+".sh"), "--foreground",
		"--state-dir", filepath.Join(s.root, "state"), "--etc-dir", filepath.Join(s.root, "etc"), "--bin-dir", filepath.Join(s.root, "bin"),
		"--", "--insecure-registries", h.registry}
	if hostDir != "" {
		args = append(args, "--host-net-dir", hostDir)
	}
	cmd := exec.Command("sh", args...)
	cmd.Stdout, cmd.Stderr = s.out, s.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The join script execs the agent: this is the agent's pid.
	s.pid = cmd.Process.Pid
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stopped := false
	s.stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent %s (%s) output:\n%s", name, s.prefix, s.out.String())
		}
		s.stop()
	})
	controlplanetest.Eventually(t, 60*time.Second, "agent "+name+" online", func() bool {
		ms := w.machines(t)
		return len(ms) == 1 && ms[0].State == "MACHINE_STATE_ONLINE"
	})
	return s
}

// hostNetScript is the task every stack runs: the host through its
// bridge's gateway, the "internet" (NATed: that namespace has no route to
// any container subnet, and its listener prints the source it saw), then
// the metadata address, which observe mode lets through and counts.
func (h *hostNet) script() string {
	ihost, iport, _ := strings.Cut(h.inetAddr, ":")
	return fmt.Sprintf(`gw=$(ip -4 route show default | awk '{print $3}')
echo "gateway $gw"
nc -w 5 $gw %d </dev/null
nc -w 5 %s %s </dev/null
nc -w 1 169.254.169.254 80 </dev/null
echo done`, h.hostPort, ihost, iport)
}

// runTask runs the stack's task and returns its ID.
func (s *hostStack) runTask(t *testing.T, h *hostNet) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r := exec.CommandContext(ctx, filepath.Join(bin, "levers9"), "run", "--", "sh", "-c", h.script())
	r.Env = append(r.Environ(), "LEVERS9_HOME="+s.home)
	var so, se testenv.SyncBuffer
	r.Stdout, r.Stderr = &so, &se
	err := r.Run()
	stdout := so.String()
	if err != nil || !strings.Contains(stdout, "host-answered") || !strings.Contains(stdout, "internet-answered from "+h.inetGateway+":") ||
		!strings.Contains(stdout, "done") {
		t.Fatalf("task on %s: %v (want the host's and the internet's answers, the latter from %s: NAT)\nstdout:\n%s\nstderr:\n%s",
			s.prefix, err, h.inetGateway, stdout, se.String())
	}
	var l struct {
		Tasks []shownTask `json:"tasks"`
	}
	s.cliJSON(t, &l, "task", "list")
	if len(l.Tasks) == 0 {
		t.Fatal("no task listed")
	}
	return l.Tasks[0].ID
}

// readiness is the part of `levers9 security report -o json` the test
// reads.
type readiness struct {
	Report struct {
		MachinesReporting int      `json:"machinesReporting"`
		MachinesBlind     []string `json:"machinesBlind"`
		Total             string   `json:"total"`
		ByTask            []struct {
			Task  string `json:"task"`
			Class string `json:"class"`
			Count string `json:"count"`
		} `json:"byTask"`
	} `json:"report"`
}

// waitMatchCounted waits until the stack's readiness report counts the
// task's metadata connection, and checks no machine is blind.
func (s *hostStack) waitMatchCounted(t *testing.T, task string) {
	t.Helper()
	var r readiness
	controlplanetest.Eventually(t, 30*time.Second, "the metadata match of "+task+" in the readiness report of "+s.prefix, func() bool {
		r = readiness{}
		s.cliJSON(t, &r, "security", "report", "--pool", "default")
		return slices.ContainsFunc(r.Report.ByTask, func(c struct {
			Task  string `json:"task"`
			Class string `json:"class"`
			Count string `json:"count"`
		}) bool {
			return c.Task == task && c.Class == egress.ClassMetadata && c.Count != "" && c.Count != "0"
		})
	})
	if r.Report.MachinesReporting != 1 || len(r.Report.MachinesBlind) != 0 {
		t.Errorf("%s readiness: %d machines reporting, blind %v", s.prefix, r.Report.MachinesReporting, r.Report.MachinesBlind)
	}
	out, _, err := s.cli(t, "security", "report", "--pool", "default")
	if err != nil || !strings.Contains(out, "safe to enforce: no") {
		t.Errorf("%s security report: %v\n%s", s.prefix, err, out)
	}
}

// claimOf is the stack's agent's host claim.
func (h *hostNet) claimOf(t *testing.T, prefix string) (egress.HostClaim, bool) {
	t.Helper()
	return claimIn(t, h.hostDir, prefix)
}

// claimIn is the claim of prefix in the claims directory dir ("" the
// host's).
func claimIn(t *testing.T, dir, prefix string) (egress.HostClaim, bool) {
	t.Helper()
	cs, err := egress.Claims(egress.HostConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Owner.Prefix == prefix {
			return c, true
		}
	}
	return egress.HostClaim{}, false
}

func linkExists(name string) bool { return exec.Command("ip", "link", "show", name).Run() == nil }

// TestHostNetworkAcrossStacks: local stacks on one host, their agents in
// the root network namespace as `make up` runs them, claiming their
// subnets and NFLOG groups from the host allocator.
//
// (a) One after the other: stack 1 runs a task, then its agent is stopped
// and its state removed (an older `make down` and `rm -rf .levers9-dev`,
// leaving its bridge); stack 2 (a new controlplane, a new machine ID)
// starts: the dead agent's bridge is gone, its tasks reach the host and
// NAT out, and its observe-mode metadata match is counted in its
// readiness report, which is not blind.
// (b) Side by side: stack 3 starts while stack 2 runs: each has its own
// subnet and NFLOG group, tasks on both reach the host and NAT out, and
// each report counts its own task's match.
func TestHostNetworkAcrossStacks(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc", "iptables", "ip")
	h := &hostNet{hostDir: t.TempDir()}
	var prefixes []string
	t.Cleanup(func() {
		// After every agent stopped (cleanups run last-in first-out).
		if err := egress.ReleaseHost(context.Background(), egress.HostConfig{Dir: h.hostDir}, prefixes, true); err != nil {
			t.Errorf("remove the agents' networks: %v", err)
		}
	})

	// The image registry, on loopback as `make up`'s.
	reg, err := devstack.StartRegistry(context.Background(), filepath.Join(t.TempDir(), "registry"), "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop() })
	h.registry = reg.Addr()
	res, err := build.BuildBusybox(context.Background(), reg.Addr(), "levers9/demo", "hostnet", nil, build.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	h.image = res.Ref

	// A service on the host, on every address.
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go answer(l, func(net.Conn) string { return "host-answered\n" })
	h.hostPort = l.Addr().(*net.TCPAddr).Port

	// The "internet": a namespace behind a veth, with no route to any
	// container subnet, so only NAT brings an answer back.
	h.inetGateway, h.inetAddr = internet(t)

	// (a) One after the other.
	s1 := h.startStack(t, "stack1")
	prefixes = append(prefixes, s1.prefix)
	c1, ok := h.claimOf(t, s1.prefix)
	if !ok || !linkExists(s1.prefix+"br") {
		t.Fatalf("stack 1 (%s): claim %v, bridge %v", s1.prefix, ok, linkExists(s1.prefix+"br"))
	}
	t.Logf("stack 1: %s subnet %s nflog %d", s1.prefix, c1.SubnetV4, c1.NFLOGGroup)
	s1.runTask(t, h)
	s1.stop()
	s1.in.Server.Stop()
	if err := os.RemoveAll(s1.root); err != nil {
		t.Fatal(err)
	}
	if !linkExists(s1.prefix + "br") {
		t.Fatalf("stack 1's bridge went with its agent; the test needs it left behind")
	}

	start := time.Now()
	s2 := h.startStack(t, "stack2")
	prefixes = append(prefixes, s2.prefix)
	if s2.id == s1.id || s2.prefix == s1.prefix {
		t.Fatalf("stack 2 has stack 1's machine %s", s2.id)
	}
	if linkExists(s1.prefix + "br") {
		t.Errorf("stack 1's bridge %sbr is still there after stack 2's agent started", s1.prefix)
	}
	if _, ok := h.claimOf(t, s1.prefix); ok {
		t.Errorf("stack 1's claim is still there after stack 2's agent started")
	}
	c2, _ := h.claimOf(t, s2.prefix)
	t.Logf("stack 2: %s subnet %s nflog %d", s2.prefix, c2.SubnetV4, c2.NFLOGGroup)
	task2 := s2.runTask(t, h)
	s2.waitMatchCounted(t, task2)
	t.Logf("one after the other: stack 2 checked in %v", time.Since(start).Round(time.Millisecond))

	// (b) Side by side.
	start = time.Now()
	s3 := h.startStack(t, "stack3")
	prefixes = append(prefixes, s3.prefix)
	c2, ok2 := h.claimOf(t, s2.prefix)
	c3, ok3 := h.claimOf(t, s3.prefix)
	if !ok2 || !ok3 || !linkExists(s2.prefix+"br") || !linkExists(s3.prefix+"br") {
		t.Fatalf("side by side: claims %v %v, bridges %v %v", ok2, ok3, linkExists(s2.prefix+"br"), linkExists(s3.prefix+"br"))
	}
	t.Logf("stack 3: %s subnet %s nflog %d", s3.prefix, c3.SubnetV4, c3.NFLOGGroup)
	n2, n3 := netipPrefix(t, c2.SubnetV4), netipPrefix(t, c3.SubnetV4)
	if n2.Overlaps(n3) || c2.SubnetV6 == c3.SubnetV6 || c2.NFLOGGroup == c3.NFLOGGroup {
		t.Errorf("side by side, shared resources: %+v and %+v", c2, c3)
	}
	tasks := make([]string, 2)
	for i, s := range []*hostStack{s2, s3} {
		tasks[i] = s.runTask(t, h)
	}
	s2.waitMatchCounted(t, tasks[0])
	s3.waitMatchCounted(t, tasks[1])
	t.Logf("side by side: checked in %v", time.Since(start).Round(time.Millisecond))

	t.Run("make down", func(t *testing.T) { checkMakeDown(t, h) })
}

// checkMakeDown runs `make down`'s code (localstack.Down) on a local stack
// whose agent claimed its network from the host's claims directory, as a
// `make up` agent does: Down stops the agent through its pid file and
// removes its bridge, chains and claim; the next stack's agent then gets a
// working network.
func checkMakeDown(t *testing.T, h *hostNet) {
	var prefixes []string
	t.Cleanup(func() {
		if len(prefixes) > 0 {
			if err := egress.ReleaseHost(context.Background(), egress.HostConfig{}, prefixes, true); err != nil {
				t.Errorf("remove the agents' networks: %v", err)
			}
		}
	})
	s := h.startStackIn(t, "stack4", "")
	prefixes = append(prefixes, s.prefix)
	if _, ok := claimIn(t, "", s.prefix); !ok || !linkExists(s.prefix+"br") {
		t.Fatalf("stack 4 (%s): claim in %s %v, bridge %v", s.prefix, egress.DefaultHostDir, ok, linkExists(s.prefix+"br"))
	}
	s.runTask(t, h)

	// .levers9-dev as `make up` leaves it, for the parts Down reads: the
	// state naming the agent's machine and the agent's pid file (no
	// controlplane, Redis or Postgres of its own here).
	p := localstack.NewPaths(t.TempDir())
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	state, _ := json.Marshal(localstack.State{LocalMachineID: s.id})
	if err := os.WriteFile(filepath.Join(p.Dir, "stack.json"), state, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.Dir, "agent.pid"), []byte(fmt.Sprint(s.pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	var out testenv.SyncBuffer
	if err := localstack.Down(context.Background(), p, &out); err != nil {
		t.Fatalf("down: %v\n%s", err, out.String())
	}
	t.Logf("down:\n%s", out.String())
	if syscall.Kill(s.pid, 0) == nil {
		t.Errorf("the agent (pid %d) still runs after down", s.pid)
	}
	if linkExists(s.prefix + "br") {
		t.Errorf("bridge %sbr still there after down", s.prefix)
	}
	if _, ok := claimIn(t, "", s.prefix); ok {
		t.Errorf("the agent's claim is still in %s after down", egress.DefaultHostDir)
	}
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		b, err := exec.Command(save).Output()
		if err != nil {
			t.Fatalf("%s: %v", save, err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, s.prefix) {
				t.Errorf("%s after down: %s", save, l)
			}
		}
	}
	if !strings.Contains(out.String(), "removing the agents' container networks ("+s.prefix+")") {
		t.Errorf("down did not say it removed the network:\n%s", out.String())
	}

	// The next `make up` after `rm -rf .levers9-dev`: a new machine.
	s5 := h.startStackIn(t, "stack5", "")
	prefixes = append(prefixes, s5.prefix)
	s5.waitMatchCounted(t, s5.runTask(t, h))
}

// answer answers every connection on l with what(conn).
func answer(l net.Listener, what func(net.Conn) string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte(what(c)))
		_ = c.Close()
	}
}

// internet makes a namespace linked to the host by a veth on a /30 and a
// listener in it that answers with the source address it saw. It returns
// the host's address on the link and the listener's HOST:PORT.
func internet(t *testing.T) (gateway, addr string) {
	t.Helper()
	n, _ := rand.Int(rand.Reader, big.NewInt(60))
	name := fmt.Sprintf("l9inet%02d", n.Int64())
	// 198.18.0.0/15 (benchmarking): no private class of the egress rules.
	gateway, far := fmt.Sprintf("198.18.%d.1", n.Int64()*4), fmt.Sprintf("198.18.%d.2", n.Int64()*4)
	ip(t, "netns", "add", name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", name+"h").Run()
		_ = exec.Command("ip", "netns", "del", name).Run()
	})
	ip(t, "link", "add", name+"h", "type", "veth", "peer", "name", name+"b")
	ip(t, "link", "set", name+"b", "netns", name)
	ip(t, "addr", "add", gateway+"/30", "dev", name+"h")
	ip(t, "link", "set", name+"h", "up")
	ip(t, "-n", name, "addr", "add", far+"/30", "dev", name+"b")
	ip(t, "-n", name, "link", "set", name+"b", "up")
	ip(t, "-n", name, "link", "set", "lo", "up")

	// A socket opened while the thread is in the namespace stays there.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	target, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		t.Fatal(err)
	}
	l, lerr := net.Listen("tcp", far+":0")
	if err := netns.Set(orig); err != nil {
		panic(fmt.Sprintf("back to the test's namespace: %v", err))
	}
	if lerr != nil {
		t.Fatal(lerr)
	}
	t.Cleanup(func() { l.Close() })
	go answer(l, func(c net.Conn) string { return "internet-answered from " + c.RemoteAddr().String() + "\n" })
	return gateway, l.Addr().String()
}

func netipPrefix(t *testing.T, s string) netip.Prefix {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil {
		t.Fatalf("subnet %q: %v", s, err)
	}
	return p
}
