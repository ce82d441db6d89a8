package sandbox

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// buildProbe compiles the static probe program into dir.
func buildProbe(t testing.TB, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "probe")
	cmd := exec.Command("go", "build", "-o", out, "./internal/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, b)
	}
	return out
}

// makeRootfs lays out a minimal image: busybox, the probe and a setuid-root
// copy of it.
func makeRootfs(t testing.TB, probe string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "mnt"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	copyFile(t, "/bin/busybox", filepath.Join(root, "bin/busybox"), 0o755)
	for _, l := range []string{"sh", "echo", "cat", "sleep", "true", "id"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", l)); err != nil {
			t.Fatal(err)
		}
	}
	if probe != "" {
		copyFile(t, probe, filepath.Join(root, "probe"), 0o755)
		copyFile(t, probe, filepath.Join(root, "suidprobe"), 0o755)
		// Chmod after write: the kernel clears setuid on write.
		if err := os.Chmod(filepath.Join(root, "suidprobe"), 0o755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func copyFile(t testing.TB, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

type bundle struct {
	sb   *Sandbox
	host Host
}

// setupSandbox makes a Sandbox with its own state dir and cgroup parent,
// reconciles leftovers of a killed run first and again at cleanup.
func setupSandbox(t *testing.T) bundle {
	t.Helper()
	ctx := context.Background()
	host, err := DetectHost(ctx, NVIDIADiscovery{})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := New(Config{Prefix: "l9s", StateDir: "/run/l9s-test", CgroupParent: "/l9s-test", Host: host})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Reconcile(ctx); err != nil {
		t.Fatalf("reconcile leftovers: %v", err)
	}
	t.Cleanup(func() {
		sb.Close()
		if err := sb.Reconcile(context.Background()); err != nil {
			t.Errorf("reconcile: %v", err)
		}
		if _, err := os.Stat("/run/l9s-test"); !os.IsNotExist(err) {
			t.Errorf("state dir left behind: %v", err)
		}
	})
	return bundle{sb: sb, host: host}
}
