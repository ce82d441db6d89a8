package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
)

type joinWorld struct {
	box  *box
	in   *controlplanetest.Instance
	home string
	cert string
}

func (w *joinWorld) cli(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "levers9"), args...)
	cmd.Env = append(os.Environ(), "LEVERS9_HOME="+w.home)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// controlplanetestConfig is the controlplane config a world starts with.
type controlplanetestConfig = config.Config

func setupJoinWorld(t *testing.T) *joinWorld {
	t.Helper()
	return setupJoinWorldWith(t, nil)
}

func setupJoinWorldWith(t *testing.T, mutate func(*config.Config)) *joinWorld {
	t.Helper()
	b := newBox(t)
	cert, key := controlplanetest.SelfSignedTLS(t, b.hostIP)
	cfg := env.Config(t)
	cfg.Controlplane.PublicHost = b.hostIP
	cfg.Controlplane.TLS.CertFile, cfg.Controlplane.TLS.KeyFile = cert, key
	cfg.Controlplane.AgentBinariesDir = bin
	if mutate != nil {
		mutate(cfg)
	}
	// The ports are picked only now, just before the controlplane binds
	// them, and on the box's address where it binds them: what mutate
	// starts (SeaweedFS, registries) dials out from that address, and one
	// of its ephemeral ports once took a port picked before it on
	// 127.0.0.1 ("bind: address already in use"). The tunnel's port is
	// free for UDP (QUIC) too.
	ports, err := devstack.FreeTCPUDPPorts(b.hostIP, 3)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Controlplane.GRPCAddr = fmt.Sprintf("%s:%d", b.hostIP, ports[0])
	cfg.Controlplane.RESTAddr = fmt.Sprintf("%s:%d", b.hostIP, ports[1])
	cfg.Controlplane.TunnelAddr = fmt.Sprintf("%s:%d", b.hostIP, ports[2])
	in := controlplanetest.Start(t, cfg, true)
	controlplanetest.WaitTunnelEndpoint(t, in)
	w := &joinWorld{box: b, in: in, home: filepath.Join(t.TempDir(), "home"), cert: cert}
	cmd := exec.Command(filepath.Join(bin, "levers9"), "config", "create", "e2e", "--controlplane", in.Server.GRPCAddr(), "--tls", "--ca", cert)
	cmd.Env = append(os.Environ(), "LEVERS9_HOME="+w.home, "LEVERS9_BOOTSTRAP_SECRET=test-bootstrap-secret-0123456789abcdef")
	cmd.Stdin = strings.NewReader("\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("config create: %v\n%s", err, out)
	}
	return w
}

// runScript runs the join script in the box, in the foreground, until the
// test stops it.
func (w *joinWorld) runScript(t *testing.T, script, root string, extra ...string) (stop func(), output *testenv.SyncBuffer) {
	t.Helper()
	output = &testenv.SyncBuffer{}
	// nsenter, not `ip netns exec`: that one also remounts /sys in a new
	// mount namespace, which hides the cgroup mounts runc needs.
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + w.box.ns, "sh", script, "--foreground",
		"--state-dir", filepath.Join(root, "state"), "--etc-dir", filepath.Join(root, "etc"), "--bin-dir", filepath.Join(root, "bin")}, extra...)...)
	cmd.Stdout, cmd.Stderr = output, output
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-done
			}
		})
	}
	t.Cleanup(stop)
	return stop, output
}

type listedMachine struct {
	ID           string `json:"id"`
	State        string `json:"state"`
	Transport    string `json:"transport"`
	AgentVersion string `json:"agentVersion"`
	Inventory    struct {
		Cpus        int    `json:"cpus"`
		Kernel      string `json:"kernel"`
		RuncVersion string `json:"runcVersion"`
	} `json:"inventory"`
}

func (w *joinWorld) machines(t *testing.T) []listedMachine {
	t.Helper()
	var l struct {
		Machines []listedMachine `json:"machines"`
	}
	w.cliJSON(t, &l, "machine", "list")
	return l.Machines
}

// cliJSON runs the CLI with args and -o json and decodes its output into v,
// failing the test on an error.
func (w *joinWorld) cliJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	args = append(args, "-o", "json")
	out, errOut, err := w.cli(t, args...)
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("%s output %q: %v", strings.Join(args, " "), out, err)
	}
}

// processArgsContain reports whether any process's command line holds s.
func processArgsContain(s string) bool {
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

func TestMachineJoinEndToEnd(t *testing.T) {
	w := setupJoinWorld(t)

	out, errOut, err := w.cli(t, "machine", "create", "--pool", "default", "--name", "box-1")
	if err != nil {
		t.Fatalf("machine create: %v %s", err, errOut)
	}
	id := regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)[1]
	script := filepath.Join(w.home, "machines", id+".sh")
	st, err := os.Stat(script)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("script mode: %v %v", st, err)
	}
	body, _ := os.ReadFile(script)
	token := regexp.MustCompile(`l9join_[a-z2-7]{16}_[a-z2-7]{52}`).FindString(string(body))
	if token == "" || strings.Contains(out+errOut, token) || strings.Contains(out+errOut, token[24:]) {
		t.Fatalf("token missing from the script or shown by the CLI")
	}

	root := t.TempDir()
	start := time.Now()
	stop, agentOut := w.runScript(t, script, root)
	var m listedMachine
	controlplanetest.Eventually(t, 10*time.Second, "machine online with inventory (agent output follows)\n"+agentOut.String(), func() bool {
		ms := w.machines(t)
		if len(ms) == 1 {
			m = ms[0]
		}
		return len(ms) == 1 && m.State == "MACHINE_STATE_ONLINE" && m.Inventory.Cpus > 0
	})
	t.Logf("online after %v over %s: %+v", time.Since(start).Round(time.Millisecond), m.Transport, m.Inventory)
	if m.ID != id || m.Inventory.RuncVersion == "" {
		t.Errorf("listed %+v", m)
	}
	if m.AgentVersion != stampedVersion {
		t.Errorf("machine list shows agent version %q, want the stamped %q", m.AgentVersion, stampedVersion)
	}
	key, err := os.ReadFile(filepath.Join(root, "state", "agent.key"))
	if err != nil {
		t.Fatal(err)
	}
	keyBody := strings.Split(string(key), "\n")[1]
	if _, err := os.Stat(filepath.Join(root, "etc", "join-token")); !os.IsNotExist(err) {
		t.Error("the join token file outlived the join")
	}
	if processArgsContain(token) || processArgsContain(keyBody) {
		t.Error("a process's command line shows the token or the key")
	}

	// Running the script again changes nothing: same machine, one machine.
	stop()
	stop2, agentOut2 := w.runScript(t, script, root)
	defer stop2()
	controlplanetest.Eventually(t, 10*time.Second, "online again after the second run\n"+agentOut2.String(), func() bool {
		ms := w.machines(t)
		return len(ms) == 1 && ms[0].ID == id && ms[0].State == "MACHINE_STATE_ONLINE"
	})
	if !strings.Contains(agentOut2.String(), "already joined") {
		t.Errorf("second run did not notice the join: %s", agentOut2.String())
	}
	key2, _ := os.ReadFile(filepath.Join(root, "state", "agent.key"))
	if !bytes.Equal(key, key2) {
		t.Error("the second run replaced the key")
	}

	// The same token used twice is refused.
	_, err = v1.NewEnrollServiceClient(w.in.Conn).Enroll(context.Background(), &v1.EnrollRequest{JoinToken: token, CsrPem: "x"})
	if err == nil {
		t.Error("a used token enrolled again")
	}
	tokenFile := filepath.Join(t.TempDir(), "tok")
	os.WriteFile(tokenFile, []byte(token), 0o600)
	cmd := exec.Command("ip", "netns", "exec", w.box.ns, filepath.Join(bin, "levers9-agent"), "join",
		"--controlplane", w.in.Server.GRPCAddr(), "--ca-file", w.cert, "--token-file", tokenFile, "--state-dir", t.TempDir())
	reuse, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(reuse), "already used") {
		t.Errorf("second use of the token: %v: %s", err, reuse)
	}

	// Delete: offline within 2 s, and the certificate no longer connects.
	if _, errOut, err := w.cli(t, "machine", "delete", id); err != nil {
		t.Fatal(errOut)
	}
	delStart := time.Now()
	controlplanetest.Eventually(t, 2*time.Second, "offline after delete", func() bool {
		_, online := w.in.Server.Agents().Online(id)
		return !online
	})
	t.Logf("offline %v after delete", time.Since(delStart).Round(time.Millisecond))
	controlplanetest.Eventually(t, 10*time.Second, "the agent's reconnect refused", func() bool {
		return len(w.in.Logs.Find("tunnel refused: machine deleted")) > 0
	})
	if _, online := w.in.Server.Agents().Online(id); online {
		t.Error("deleted machine back online")
	}

	// Nothing logged or printed shows the token or the key.
	all := w.in.Logs.String() + agentOut.String() + agentOut2.String() + string(reuse)
	if strings.Contains(all, token) || strings.Contains(all, token[24:]) || strings.Contains(all, keyBody) {
		t.Error("a log or output line shows the token or the key")
	}
}
