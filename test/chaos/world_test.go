package chaos

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/clientconfig"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testbox"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sdk"
)

// world is the whole stack of one run.
type world struct {
	boxes    []*box
	replicas []*replica
	agents   []*agent
	registry string
	cert     string
	home     string
	token    string
	clients  []*sdk.Client
	// logs holds the replicas' and agents' logs; kept when the test fails.
	logs string
}

// box is a machine in its own network namespace, joined to the host by a
// veth pair on a /30 (as test/e2e's newBox).
type box struct {
	ns            string
	hostIP, boxIP string
}

func ip(t *testing.T, args ...string) { t.Helper(); testbox.IP(t, args...) }

// newBox makes a namespace l9k<hex> on 10.198.N.0/30.
func newBox(t *testing.T) *box {
	t.Helper()
	b := testbox.New(t, "l9k", 198)
	return &box{ns: b.NS, hostIP: b.HostIP, boxIP: b.BoxIP}
}

// freePorts is n ports free for TCP and UDP on ip, or the end of the test.
func freePorts(t *testing.T, ip string, n int) []int {
	t.Helper()
	p, err := devstack.FreeTCPUDPPorts(ip, n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// replica is one levers9-controlplane process; kill and start again keep
// its addresses.
type replica struct {
	name                        string
	cfgPath, logPath            string
	grpc, rest, tunnel, metrics string
	// mu guards cmd and done.
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func newReplica(t *testing.T, name string, base *config.Config, host, logs string) *replica {
	t.Helper()
	c := *base
	ports := freePorts(t, host, 3)
	r := &replica{name: name,
		grpc:    net.JoinHostPort(host, strconv.Itoa(ports[0])),
		rest:    net.JoinHostPort(host, strconv.Itoa(ports[1])),
		tunnel:  net.JoinHostPort(host, strconv.Itoa(ports[2])),
		metrics: net.JoinHostPort("127.0.0.1", strconv.Itoa(freePorts(t, "127.0.0.1", 1)[0])),
	}
	c.Controlplane.GRPCAddr, c.Controlplane.RESTAddr, c.Controlplane.TunnelAddr = r.grpc, r.rest, r.tunnel
	c.Controlplane.Metrics.Addr = r.metrics
	b, err := yaml.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r.cfgPath, r.logPath = filepath.Join(dir, "config.yaml"), filepath.Join(logs, name+".log")
	if err := os.WriteFile(r.cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	return r
}

// start runs the process and waits until it says it is healthy.
func (r *replica) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "levers9-controlplane"), "--config", r.cfgPath)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	testenv.Eventually(t, 60*time.Second, r.name+" healthy (log "+r.logPath+")", func() bool {
		select {
		case <-done:
			t.Fatalf("%s exited:\n%s", r.name, r.logTail())
		default:
		}
		resp, err := hc.Get("https://" + r.rest + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// signal sends sig and waits (up to within, then SIGKILL) for the exit.
func (r *replica) signal(sig syscall.Signal, within time.Duration) {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(within):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (r *replica) kill() { r.signal(syscall.SIGKILL, time.Minute) }
func (r *replica) stop() { r.signal(syscall.SIGTERM, 30*time.Second) }

func (r *replica) logTail() string {
	b, _ := os.ReadFile(r.logPath)
	return string(b[max(0, len(b)-8000):])
}

// agent is one machine: a box running the real levers9-agent its join
// script downloaded.
type agent struct {
	id, prefix   string
	box          *box
	script, root string
	via          *replica
	out          *testenv.SyncBuffer
	// mu guards cmd and done.
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (a *agent) stateDir() string { return filepath.Join(a.root, "state") }

// start runs the join script in the box (joining the first time, later
// only starting the agent).
func (a *agent) start(t *testing.T, registry string) {
	t.Helper()
	// nsenter, not `ip netns exec`: that one also remounts /sys, which
	// hides the cgroup mounts runc needs.
	cmd := exec.Command("nsenter", "--net=/run/netns/"+a.box.ns, "sh", a.script, "--foreground",
		"--state-dir", a.stateDir(), "--etc-dir", filepath.Join(a.root, "etc"), "--bin-dir", filepath.Join(a.root, "bin"),
		"--", "--insecure-registries", registry, "--prefix", a.prefix)
	cmd.Stdout, cmd.Stderr = a.out, a.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	a.mu.Lock()
	a.cmd, a.done = cmd, done
	a.mu.Unlock()
}

// kill SIGKILLs the agent process itself (no goodbye on its tunnel; its
// containers keep running) and waits for the script to end.
func (a *agent) kill(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	cmd, done := a.cmd, a.done
	a.mu.Unlock()
	if pid := agentPID(a.stateDir()); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// stop ends the agent cleanly (SIGTERM to the script's group).
func (a *agent) stop() {
	a.mu.Lock()
	cmd, done := a.cmd, a.done
	a.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// agentPID finds the `levers9-agent run` process with stateDir, 0 if none.
func agentPID(stateDir string) int {
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("levers9-agent\x00run\x00")) {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i, a := range args {
			if a == "--state-dir" && i+1 < len(args) && args[i+1] == stateDir {
				var pid int
				fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid)
				return pid
			}
		}
	}
	return 0
}

// cli runs the levers9 CLI with the world's home and extra environment.
func (w *world) cli(t *testing.T, extraEnv []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "levers9"), args...)
	cmd.Env = append(append(os.Environ(), "LEVERS9_HOME="+w.home), extraEnv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Stdin = strings.NewReader("\n")
	if err := cmd.Run(); err != nil {
		t.Fatalf("levers9 %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

// via is the environment that points the CLI or SDK at replica r.
func (w *world) via(r *replica) []string {
	return []string{"LEVERS9_CONTROLPLANE=" + r.grpc, "LEVERS9_CONTROLPLANE_CA=" + w.cert, "LEVERS9_CONTROLPLANE_TLS=true", "LEVERS9_TOKEN=" + w.token}
}

// setup starts everything: boxes, registry with busybox, two replicas,
// the first workspace, three agents (two joined through the first replica,
// one through the second) and an SDK client per replica.
func setup(t *testing.T, runID string) *world {
	t.Helper()
	w := &world{home: filepath.Join(t.TempDir(), "home")}
	var err error
	if w.logs, err = os.MkdirTemp("", "l9chaos-logs-"); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs last, after the agents stopped.
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(w.logs)
			return
		}
		for _, a := range w.agents {
			_ = os.WriteFile(filepath.Join(w.logs, a.prefix+"-"+a.id+".log"), []byte(a.out.String()), 0o600)
		}
		t.Logf("logs of the replicas and agents kept in %s", w.logs)
	})
	for len(w.boxes) < 3 {
		b := newBox(t)
		if len(w.boxes) > 0 && b.hostIP == w.boxes[0].hostIP {
			continue
		}
		w.boxes = append(w.boxes, b)
	}
	host := w.boxes[0].hostIP
	for _, b := range w.boxes[1:] {
		ip(t, "-n", b.ns, "route", "add", host+"/32", "via", b.hostIP)
	}
	cert, key := controlplanetest.SelfSignedTLS(t, host)
	w.cert = cert

	reg, err := devstack.StartRegistry(context.Background(), filepath.Join(t.TempDir(), "registry"), host, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop() })
	w.registry = reg.Addr()
	img, err := build.BuildBusybox(context.Background(), reg.Addr(), "levers9/chaos", "c1", nil, build.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}

	cfg := env.Config(t)
	cfg.Controlplane.PublicHost = host
	cfg.Controlplane.TLS.CertFile, cfg.Controlplane.TLS.KeyFile = cert, key
	cfg.Controlplane.AgentBinariesDir = bin
	cfg.Controlplane.LogLevel = "info"
	// Longer than a replica's restart: agents of a killed replica come
	// back to it before their attempts are given up.
	cfg.Controlplane.LostAgentGrace = "20s"
	cfg.Worker.DefaultImage = img.Ref
	for _, name := range []string{"replica-a", "replica-b"} {
		r := newReplica(t, name, cfg, host, w.logs)
		r.start(t)
		w.replicas = append(w.replicas, r)
	}

	cmd := exec.Command(filepath.Join(bin, "levers9"), "config", "create", "chaos", "--controlplane", w.replicas[0].grpc, "--tls", "--ca", cert)
	cmd.Env = append(os.Environ(), "LEVERS9_HOME="+w.home, "LEVERS9_BOOTSTRAP_SECRET="+cfg.Controlplane.Auth.BootstrapSecret)
	cmd.Stdin = strings.NewReader("\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("config create: %v\n%s", err, out)
	}
	f, err := clientconfig.LoadFile(w.home)
	if err != nil {
		t.Fatal(err)
	}
	w.token = f.Contexts["chaos"].Token

	idRE := regexp.MustCompile(`machine (m_[a-z2-7]+)`)
	for i, b := range w.boxes {
		via := w.replicas[i%2]
		out := w.cli(t, w.via(via), "machine", "create", "--pool", "default", "--name", fmt.Sprintf("chaos-%d", i))
		m := idRE.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("machine create said: %s", out)
		}
		a := &agent{id: m[1], prefix: fmt.Sprintf("l9x%s%d", runID, i), box: b, via: via, out: &testenv.SyncBuffer{},
			script: filepath.Join(w.home, "machines", m[1]+".sh"), root: filepath.Join(t.TempDir(), fmt.Sprintf("box%d", i))}
		t.Cleanup(a.stop)
		a.start(t, w.registry)
		w.agents = append(w.agents, a)
	}
	w.waitOnline(t, 90*time.Second)

	for _, r := range w.replicas {
		e := map[string]string{}
		for _, kv := range w.via(r) {
			k, v, _ := strings.Cut(kv, "=")
			e[k] = v
		}
		c, err := sdk.NewClient(context.Background(), sdk.WithGetenv(func(k string) string { return e[k] }))
		if err != nil {
			t.Fatal(err)
		}
		w.clients = append(w.clients, c)
	}
	return w
}

// waitOnline waits until every machine is online.
func (w *world) waitOnline(t *testing.T, within time.Duration) {
	t.Helper()
	testenv.Eventually(t, within, "all machines online", func() bool {
		var l struct {
			Machines []struct {
				ID    string `json:"id"`
				State string `json:"state"`
			} `json:"machines"`
		}
		cmd := exec.Command(filepath.Join(bin, "levers9"), "machine", "list", "-o", "json")
		cmd.Env = append(append(os.Environ(), "LEVERS9_HOME="+w.home), w.via(w.replicas[0])...)
		out, err := cmd.Output()
		if err != nil || json.Unmarshal(out, &l) != nil {
			return false
		}
		online := 0
		for _, m := range l.Machines {
			if m.State == "MACHINE_STATE_ONLINE" {
				online++
			}
		}
		return online == len(w.agents)
	})
}
