package seaweedfs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/volumes"
)

// pinnedRunsc is where `make deps` installs the runsc levers9 runs
// (agent.PinnedRunsc; the agent package is not imported here).
const pinnedRunsc = "/usr/local/lib/levers9/runsc"

// containerBundle is a sandbox able to run both runtimes and a busybox
// rootfs.
type containerBundle struct {
	sb     *sandbox.Sandbox
	rootfs string
}

func setupContainers(t *testing.T) containerBundle {
	t.Helper()
	testenv.RequireBinary(t, "runc", "busybox")
	runsc := pinnedRunsc
	if _, err := os.Stat(runsc); err != nil {
		testenv.Missing(t, "the pinned runsc %s (make deps): %v", runsc, err)
	}
	ctx := context.Background()
	host, err := sandbox.DetectHost(ctx, sandbox.NVIDIADiscovery{})
	if err != nil {
		t.Fatal(err)
	}
	state := fmt.Sprintf("/run/l9v-test-%d", os.Getpid())
	sb, err := sandbox.New(sandbox.Config{Prefix: "l9v", StateDir: state, CgroupParent: fmt.Sprintf("/l9v-test-%d", os.Getpid()),
		RunscPath: runsc, Host: host})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Reconcile(context.Background()); err != nil {
			t.Errorf("reconcile: %v", err)
		}
		_ = os.RemoveAll(state)
	})
	root := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "data"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile(testenv.RequireBinary(t, "busybox")[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"sh", "echo", "cat", "sleep", "grep", "test", "mkdir", "ls", "mknod", "head", "od", "rm"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", l)); err != nil {
			t.Fatal(err)
		}
	}
	return containerBundle{sb: sb, rootfs: root}
}

// run runs script in a container of rt with the mounts and returns its exit
// code and output; whileRunning, when set, is called once the container
// started, with its output so far, before the wait.
func (c containerBundle) run(t *testing.T, rt sandbox.RuntimeName, name string, mounts []sandbox.Mount, user, script string, whileRunning func(out *testenv.SyncBuffer)) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out testenv.SyncBuffer
	task := sandbox.TaskSpec{ID: name, Rootfs: c.rootfs, Args: []string{"sh", "-c", script}, Mounts: mounts, User: user}
	h, err := c.sb.Run(ctx, task, sandbox.Security{Profile: sandbox.ProfileHardened, Seccomp: sandbox.SeccompEnforce, DropNetRaw: true, Runtime: rt},
		sandbox.Stdio{Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("%s on %s: %v", name, rt, err)
	}
	defer func() { _ = h.Delete(context.Background()) }()
	if whileRunning != nil {
		whileRunning(&out)
	}
	st, err := h.Wait(ctx)
	if err != nil {
		t.Fatalf("%s on %s: wait: %v\n%s", name, rt, err, out.String())
	}
	return st.Code, out.String()
}

// TestMountedInContainers binds the driver's mounts into containers of both
// runtimes, as the agent does: a runsc task's writes reach the volume (a
// second mount, standing in for another machine, and a runc task see them),
// a runsc task sees what another machine changes while it runs, a
// read-only bind refuses writes under runsc, gVisor's mount table has
// nosuid, and no host device is reachable through a volume (nodev).
func TestMountedInContainers(t *testing.T) {
	b := setup(t)
	c := setupContainers(t)
	ctx := context.Background()
	v := volumes.Volume{ID: "vol_c1", Workspace: "ws_1", Name: "data"}
	if err := b.drv.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	// One mount per machine and mode, as the agent mounts them.
	rw := b.mount(t, v, "node-a-rw", false)
	ro := b.mount(t, v, "node-a-ro", true)
	other := b.mount(t, v, "node-b-rw", false)
	rwBind := []sandbox.Mount{{Source: rw, Destination: "/data"}}
	roBind := []sandbox.Mount{{Source: ro, Destination: "/data", ReadOnly: true}}

	t.Run("runsc writes, another machine and runc read", func(t *testing.T) {
		code, out := c.run(t, sandbox.RuntimeRunsc, "w-runsc", rwBind, "",
			"mkdir -p /data/ckpt && echo from-runsc > /data/ckpt/state && cat /data/ckpt/state", nil)
		if code != 0 || !strings.Contains(out, "from-runsc") {
			t.Fatalf("runsc writer: exit %d\n%s", code, out)
		}
		for _, m := range []string{rw, other} {
			testenv.Eventually(t, 20*time.Second, "the runsc task's file under "+m, func() bool {
				got, err := os.ReadFile(filepath.Join(m, "ckpt", "state"))
				return err == nil && string(got) == "from-runsc\n"
			})
		}
		code, out = c.run(t, sandbox.RuntimeRunc, "r-runc", roBind, "", "cat /data/ckpt/state", nil)
		if code != 0 || !strings.Contains(out, "from-runsc") {
			t.Fatalf("runc reader: exit %d\n%s", code, out)
		}
	})

	t.Run("runc writes, runsc reads", func(t *testing.T) {
		code, out := c.run(t, sandbox.RuntimeRunc, "w-runc", rwBind, "", "echo from-runc > /data/runc-file", nil)
		if code != 0 {
			t.Fatalf("runc writer: exit %d\n%s", code, out)
		}
		code, out = c.run(t, sandbox.RuntimeRunsc, "r-runsc", roBind, "", "cat /data/runc-file", nil)
		if code != 0 || !strings.Contains(out, "from-runc") {
			t.Fatalf("runsc reader: exit %d\n%s", code, out)
		}
	})

	t.Run("a running runsc task sees another machine's changes", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(other, "live"), []byte("v1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, "v1 on this machine", func() bool {
			got, err := os.ReadFile(filepath.Join(rw, "live"))
			return err == nil && string(got) == "v1\n"
		})
		script := `cat /data/live; ls /data; echo first-read
i=0; while [ $i -lt 300 ]; do
  if [ -e /data/late ] && grep -q v2 /data/live; then echo saw-changes; cat /data/late; exit 0; fi
  sleep 0.1; i=$((i+1))
done
echo still-old; cat /data/live; ls /data; exit 3`
		code, out := c.run(t, sandbox.RuntimeRunsc, "live-runsc", rwBind, "", script, func(out *testenv.SyncBuffer) {
			testenv.Eventually(t, 30*time.Second, "the first read", func() bool { return strings.Contains(out.String(), "first-read") })
			if err := os.WriteFile(filepath.Join(other, "live"), []byte("v2\n"), 0o644); err != nil {
				t.Error(err)
			}
			if err := os.WriteFile(filepath.Join(other, "late"), []byte("late-file\n"), 0o644); err != nil {
				t.Error(err)
			}
			wrote := time.Now()
			testenv.Eventually(t, 40*time.Second, "the runsc task seeing the changes", func() bool {
				o := out.String()
				return strings.Contains(o, "saw-changes") || strings.Contains(o, "still-old")
			})
			t.Logf("the runsc task saw another machine's changes within %s (it polls every 100ms)", time.Since(wrote).Round(time.Millisecond))
		})
		if code != 0 || !strings.Contains(out, "saw-changes") || !strings.Contains(out, "late-file") {
			t.Fatalf("runsc task after another machine's writes: exit %d\n%s", code, out)
		}
	})

	t.Run("read-only under runsc refuses writes", func(t *testing.T) {
		code, out := c.run(t, sandbox.RuntimeRunsc, "ro-runsc", roBind, "", "echo no > /data/nope", nil)
		if code == 0 || !strings.Contains(strings.ToLower(out), "read-only") {
			t.Fatalf("write to a read-only bind under runsc: exit %d\n%s", code, out)
		}
		if _, err := os.Stat(filepath.Join(rw, "nope")); err == nil {
			t.Fatal("the refused write reached the volume")
		}
	})

	t.Run("a non-root runsc task writes", func(t *testing.T) {
		code, out := c.run(t, sandbox.RuntimeRunsc, "nonroot-runsc", rwBind, "1000:1000", "echo by-1000 > /data/by-1000 && cat /data/by-1000", nil)
		if code != 0 || !strings.Contains(out, "by-1000") {
			t.Fatalf("non-root runsc writer: exit %d\n%s", code, out)
		}
		testenv.Eventually(t, 20*time.Second, "the non-root file on the other machine", func() bool {
			got, err := os.ReadFile(filepath.Join(other, "by-1000"))
			return err == nil && string(got) == "by-1000\n"
		})
	})

	t.Run("no host device through the volume", func(t *testing.T) {
		// 1:1 is /dev/mem. runc: mknod works on the volume, nodev refuses
		// the open. runsc: gVisor's own mount table has no nodev (the
		// sentry ignores the option), but its gofer mounts the volume
		// nodev on the host, refuses mknod on it, and its sentry serves
		// only the character devices it emulates (1:1 is not one), so the
		// node a runc task made cannot be opened either.
		read := "head -c 16 /data/mem >/dev/null && echo READ-OK || echo READ-REFUSED"
		code, out := c.run(t, sandbox.RuntimeRunc, "dev-runc", rwBind, "", "rm -f /data/mem; mknod /data/mem c 1 1 && echo MADE; "+read, nil)
		if code != 0 || !strings.Contains(out, "MADE") || !strings.Contains(out, "READ-REFUSED") {
			t.Fatalf("runc: exit %d\n%s", code, out)
		}
		code, out = c.run(t, sandbox.RuntimeRunsc, "dev-runsc", rwBind, "", "ls -l /data/mem 2>&1; head -c 16 /data/mem 2>&1 >/dev/null; "+read+"; mknod /data/mem2 c 1 1 2>&1 && echo MADE2", nil)
		if code == 0 || strings.Contains(out, "READ-OK") || strings.Contains(out, "MADE2") {
			t.Fatalf("runsc: a host device through the volume: exit %d\n%s", code, out)
		}
		t.Logf("runsc: %s", strings.TrimSpace(out))
	})

	t.Run("read-only and nosuid in gVisor's mount table", func(t *testing.T) {
		for _, m := range []struct {
			name  string
			binds []sandbox.Mount
			want  []string
		}{{"rw", rwBind, []string{"rw", "nosuid"}}, {"ro", roBind, []string{"ro", "nosuid"}}} {
			code, out := c.run(t, sandbox.RuntimeRunsc, "opts-"+m.name, m.binds, "", "grep ' /data ' /proc/mounts", nil)
			if code != 0 {
				t.Fatalf("/proc/mounts: exit %d\n%s", code, out)
			}
			var opts []string
			if f := strings.Fields(out); len(f) >= 4 {
				opts = strings.Split(f[3], ",")
			}
			for _, w := range m.want {
				if !slices.Contains(opts, w) {
					t.Errorf("%s bind: options %q lack %s", m.name, opts, w)
				}
			}
			// Shared file access: the sentry revalidates what it cached
			// against the host (the running task above saw another
			// machine's changes).
			if !slices.Contains(opts, "cache=remote_revalidating") {
				t.Errorf("%s bind: options %q: not revalidating (--file-access-mounts=shared)", m.name, opts)
			}
		}
	})
}
