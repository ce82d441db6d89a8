package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image/build"
)

// startPrivateRegistry runs Debian's docker-registry with htpasswd auth
// (one user) on host, where the boxes reach it, until the test ends.
func startPrivateRegistry(t *testing.T, host, user, password string) string {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Fatalf("docker-registry: %v", err)
	}
	dir := t.TempDir()
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	htpasswd := filepath.Join(dir, "htpasswd")
	if err := os.WriteFile(htpasswd, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	cmd, err := devstack.RegistryCommand(bin, dir, filepath.Join(dir, "storage"), addr,
		fmt.Sprintf("auth:\n  htpasswd:\n    realm: l9-e2e\n    path: %s\n", htpasswd))
	if err != nil {
		t.Fatal(err)
	}
	out := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("private registry on %s: %v\n%s", addr, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPrivateRegistry: a task whose image is in a registry that wants a
// login fails with a sentence naming the registry and the image until the
// workspace logs in; then it runs, and the password shows up in no log,
// output or file of the image cache.
func TestPrivateRegistry(t *testing.T) {
	var pw [12]byte
	_, _ = rand.Read(pw[:])
	password := "l9pw-" + hex.EncodeToString(pw[:])
	const user = "puller"
	var host, ref string
	w := setupTaskWorldWith(t, func(c *config.Config, w *taskWorld) {
		host = startPrivateRegistry(t, c.Controlplane.PublicHost, user, password)
		res, err := build.BuildBusybox(context.Background(), host, "team/private", "v1", nil,
			build.Options{Insecure: true, Username: user, Password: password})
		if err != nil {
			t.Fatal(err)
		}
		ref = res.Ref
		w.insecure = append(w.insecure, host)
	})
	var said strings.Builder // everything the CLI printed

	t.Run("without a login the registry refuses and the error says so", func(t *testing.T) {
		r := w.start(t, "run", "--image", ref, "--", "echo", "private hello")
		code := r.wait(t, 90*time.Second)
		so, se := r.out()
		said.WriteString(so + se)
		want := fmt.Sprintf("registry %s refused access to image %s (log in with levers9 registry login %s)", host, ref, host)
		if code != 1 || !strings.Contains(se, want) {
			t.Fatalf("exit %d, want stderr to contain %q\nstdout:\n%s\nstderr:\n%s", code, want, so, se)
		}
		t.Logf("levers9 run said: %s", strings.TrimSpace(se))
		ts := w.tasks(t)
		atts := w.showAttempts(t, ts[0].ID)
		if len(atts) != 1 || atts[0].Reason != "FAILURE_REASON_IMAGE_PULL_FAILED" || atts[0].Summary != want {
			t.Fatalf("attempts: %+v", atts)
		}
		so, se, _ = w.cli(t, "task", "show", ts[0].ID, "-o", "json")
		said.WriteString(so + se)
	})

	t.Run("login reads the password from stdin, list shows no secret", func(t *testing.T) {
		cmd := exec.Command(filepath.Join(bin, "levers9"), "registry", "login", host, "--username", user)
		cmd.Env = append(os.Environ(), "LEVERS9_HOME="+w.home)
		cmd.Stdin = strings.NewReader(password + "\n")
		out, err := cmd.CombinedOutput()
		said.Write(out)
		if err != nil {
			t.Fatalf("registry login: %v\n%s", err, out)
		}
		lo, le, err := w.cli(t, "registry", "list")
		said.WriteString(lo + le)
		if err != nil || !strings.Contains(lo, host) || !strings.Contains(lo, user) {
			t.Fatalf("registry list: %v\n%s%s", err, lo, le)
		}
		var listed struct {
			Credentials []struct {
				Host     string `json:"host"`
				Username string `json:"username"`
			} `json:"credentials"`
		}
		w.cliJSON(t, &listed, "registry", "list")
		if len(listed.Credentials) != 1 || listed.Credentials[0].Host != host || listed.Credentials[0].Username != user {
			t.Fatalf("registry list -o json: %+v", listed)
		}
	})

	t.Run("with the login the task runs", func(t *testing.T) {
		r := w.start(t, "run", "--image", ref, "--", "echo", "private hello")
		code := r.wait(t, 90*time.Second)
		so, se := r.out()
		said.WriteString(so + se)
		if code != 0 || !strings.Contains(so, "private hello\n") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		ts := w.tasks(t)
		so, se, _ = w.cli(t, "task", "show", ts[0].ID, "-o", "json")
		said.WriteString(so + se)
	})

	t.Run("logout forgets the login", func(t *testing.T) {
		so, se, err := w.cli(t, "registry", "logout", host)
		said.WriteString(so + se)
		if err != nil {
			t.Fatalf("registry logout: %v\n%s", err, se)
		}
		lo, _, err := w.cli(t, "registry", "list")
		if err != nil || strings.Contains(lo, host) {
			t.Fatalf("registry list after logout: %v\n%s", err, lo)
		}
		// A tag is resolved against the registry on every pull, with this
		// attempt's credentials: none now, so the cached image does not help.
		r := w.start(t, "run", "--image", ref, "--", "echo", "private hello")
		code := r.wait(t, 90*time.Second)
		so, se = r.out()
		said.WriteString(so + se)
		if code != 1 || !strings.Contains(se, "refused access to image "+ref) {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
	})

	t.Run("the password is nowhere", func(t *testing.T) {
		if strings.Contains(w.in.Logs.String(), password) {
			t.Error("the controlplane's log holds the password")
		}
		var all strings.Builder
		for _, l := range w.agentLogs {
			all.WriteString(l.String())
		}
		if !strings.Contains(all.String(), "image pull failed") || !strings.Contains(all.String(), "attempt finished") {
			t.Errorf("the agents' logs show no pull and no attempt: are they captured?\n%s", all.String())
		}
		for i, l := range w.agentLogs {
			if strings.Contains(l.String(), password) {
				t.Errorf("agent %d's log holds the password", i)
			}
		}
		if strings.Contains(said.String(), password) {
			t.Error("the CLI printed the password")
		}
		if processArgsContain(password) {
			t.Error("a process's argv holds the password")
		}
		for id, m := range w.runs {
			// The whole state directory: the image cache, attempt records,
			// bundles, network state.
			dir := filepath.Join(m.root, "state")
			_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return nil
				}
				b, err := os.ReadFile(p)
				if err == nil && bytes.Contains(b, []byte(password)) {
					t.Errorf("machine %s: %s holds the password", id, p)
				}
				return nil
			})
		}
	})
}
