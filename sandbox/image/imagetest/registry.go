// Package imagetest owns test harnesses around the image cache: a real
// registry (Debian's docker-registry, the CNCF Distribution registry) on a
// free 127.0.0.1 port with storage in t.TempDir(), and a reverse proxy in
// front of it that counts and can corrupt responses. It is for tests of any
// package; it must never bind anything but 127.0.0.1 nor outlive the test
// (processes are stopped in t.Cleanup and die with the test binary). API
// stability: experimental, test-only.
package imagetest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
)

// RegistryBinary is Debian's docker-registry.
const RegistryBinary = "docker-registry"

// RegistryOptions tune StartRegistry.
type RegistryOptions struct {
	// Users enables htpasswd authentication with these user -> password
	// pairs (a private registry).
	Users map[string]string
}

// Registry is a running docker-registry serving plain HTTP on 127.0.0.1.
type Registry struct {
	// Host is "127.0.0.1:PORT".
	Host string
	// Storage is the registry's filesystem storage root.
	Storage string

	t      testing.TB
	cmd    *exec.Cmd
	done   chan struct{}
	stderr *lockedBuffer
	// mu guards stopped.
	mu      sync.Mutex
	stopped bool
}

// StartRegistry starts a registry for the test and stops it in t.Cleanup.
// It skips (fails under CI=true) when docker-registry is not installed.
func StartRegistry(t testing.TB, opts RegistryOptions) *Registry {
	t.Helper()
	bin := testenv.RequireBinary(t, RegistryBinary)[0]
	dir := t.TempDir()
	storage := filepath.Join(dir, "storage")
	if err := os.Mkdir(storage, 0o755); err != nil {
		t.Fatal(err)
	}
	var auth string
	if len(opts.Users) > 0 {
		var lines []string
		for u, p := range opts.Users {
			h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
			if err != nil {
				t.Fatal(err)
			}
			lines = append(lines, u+":"+string(h))
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(htpasswd, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: l9i-test\n    path: %s\n", htpasswd)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := devstack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		host := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		cmd, err := devstack.RegistryCommand(bin, dir, storage, host, auth)
		if err != nil {
			t.Fatal(err)
		}
		r := &Registry{Host: host, Storage: storage, t: t, cmd: cmd, done: make(chan struct{}), stderr: &lockedBuffer{}}
		r.cmd.Stdout = r.stderr
		r.cmd.Stderr = r.stderr
		// The registry dies with the test binary even if it is killed.
		r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if err := r.cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", bin, err)
		}
		go func() { _ = r.cmd.Wait(); close(r.done) }()
		if lastErr = r.waitReady(10 * time.Second); lastErr == nil {
			t.Cleanup(r.Stop)
			return r
		}
		r.Stop()
	}
	t.Fatalf("registry did not become ready: %v", lastErr)
	return nil
}

func (r *Registry) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-r.done:
			return fmt.Errorf("registry exited: %s", r.stderr.String())
		default:
		}
		resp, err := client.Get("http://" + r.Host + "/v2/")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer on %s within %v (last error %v): %s", r.Host, timeout, err, r.stderr.String())
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-r.done:
		case <-t.C:
		}
		t.Stop()
	}
}

// Stop terminates the registry and waits for it; safe to call twice. Tests
// call it to take the network away.
func (r *Registry) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	r.stopped = true
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	if r.t.Failed() {
		r.t.Logf("registry %s output:\n%s", r.Host, r.stderr.String())
	}
}

// BlobPath is where the registry stores a blob's bytes ("sha256:<hex>"), so
// a test can tamper with them.
func (r *Registry) BlobPath(digest string) string {
	hex := strings.TrimPrefix(digest, "sha256:")
	return filepath.Join(r.Storage, "docker", "registry", "v2", "blobs", "sha256", hex[:2], hex, "data")
}

// WaitGone waits until nothing answers on the registry's address, so a test
// knows the network really is gone.
func (r *Registry) WaitGone(ctx context.Context) error {
	for {
		c, err := net.DialTimeout("tcp", r.Host, 200*time.Millisecond)
		if err != nil {
			return nil
		}
		_ = c.Close()
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 1<<20 {
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ReconcileMounts lazily unmounts every mount whose source is source (the
// image store's Config.MountSource used by tests, e.g. "l9i-test"): what a
// killed test binary left behind. Call it from TestMain.
func ReconcileMounts(source string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var errs []string
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, pf := strings.Fields(post), strings.Fields(pre)
		if len(f) < 2 || len(pf) < 5 || f[1] != source {
			continue
		}
		if err := syscall.Unmount(pf[4], syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", pf[4], err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("unmount leftovers: %s", strings.Join(errs, "; "))
	}
	return nil
}
