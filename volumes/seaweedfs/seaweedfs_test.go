package seaweedfs_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/seaweed"
	"github.com/levers9/levers9/internal/seaweed/seaweedtest"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/volumes"
	"github.com/levers9/levers9/volumes/seaweedfs"
)

type bundle struct {
	env  *seaweedtest.Env
	drv  *seaweedfs.Driver
	root string // where the test mounts
	// creds are the cluster's mount credentials (in drv's Env).
	creds seaweed.MountCredentials
}

const testSecret = "l9-test-filer-signing-key-9f3a"

func setup(t *testing.T) bundle {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Missing(t, "/dev/fuse: %v", err)
	}
	testenv.RequireBinary(t, "fusermount3")
	env := seaweedtest.Start(t)
	root := t.TempDir()
	creds, err := env.Security.MountCredentials()
	if err != nil {
		t.Fatal(err)
	}
	drv := seaweedfs.New(seaweedfs.Config{
		Bin: env.Bin, FilerAddr: env.Cluster.FilerAddr(), FilerURL: env.Cluster.FilerURL(),
		FilerKeys: env.Security.FilerKeys(),
		// The cluster's mount credentials, and a stand-in setting: weed
		// ignores an unknown WEED_ key, and the test checks it reaches the
		// environment and not argv.
		Env:      append(creds.Env(), "WEED_L9TEST_SECRET="+testSecret),
		StateDir: filepath.Join(root, "state"),
	})
	t.Cleanup(func() {
		if _, err := drv.UnmountAll(context.Background(), root); err != nil {
			t.Errorf("unmounting at cleanup: %v", err)
		}
	})
	return bundle{env: env, drv: drv, root: root, creds: creds}
}

func (b bundle) mount(t *testing.T, v volumes.Volume, name string, ro bool) string {
	t.Helper()
	target := filepath.Join(b.root, name)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := b.drv.Mount(ctx, v, target, volumes.MountOptions{ReadOnly: ro}); err != nil {
		t.Fatal(err)
	}
	return target
}

func mountPID(t *testing.T, d *seaweedfs.Driver, target string) int {
	t.Helper()
	pid := d.MountPID(target)
	if pid == 0 {
		t.Fatalf("no mount process for %s", target)
	}
	return pid
}

// TestVolume runs one cluster through the driver's whole contract.
func TestVolume(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	v := volumes.Volume{ID: "vol_a1", Workspace: "ws_1", Name: "data"}
	if err := b.drv.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	if err := b.drv.Create(ctx, v); err != nil {
		t.Fatalf("create again: %v", err)
	}
	// Two mounts stand in for two nodes.
	a := b.mount(t, v, "node-a", false)
	c := b.mount(t, v, "node-b", false)

	t.Run("write on one mount, read on the other", func(t *testing.T) {
		payload := bytes.Repeat([]byte("levers9 "), 128<<10) // 1 MiB
		if err := os.MkdirAll(filepath.Join(a, "ckpt"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(a, "ckpt", "step-1"), payload, 0o644); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, "the file on the other mount", func() bool {
			got, err := os.ReadFile(filepath.Join(c, "ckpt", "step-1"))
			return err == nil && bytes.Equal(got, payload)
		})
		testenv.Eventually(t, 20*time.Second, "stats counting the file", func() bool {
			st, err := b.drv.Stats(ctx, v)
			return err == nil && st == volumes.Stats{Bytes: 1 << 20, Files: 1, Dirs: 1}
		})
	})

	t.Run("no credential in argv", func(t *testing.T) {
		pid := mountPID(t, b.drv, a)
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		environ, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(cmdline, []byte(testSecret)) {
			t.Fatal("the mount's argv holds the credential")
		}
		if !bytes.Contains(environ, []byte("WEED_L9TEST_SECRET="+testSecret)) {
			t.Fatal("the mount's environment lacks the setting")
		}
		for what, secret := range map[string][]byte{"read key": []byte(b.creds.VolumeReadKey), "client key": b.creds.KeyPEM[30:90]} {
			if bytes.Contains(cmdline, secret) || bytes.Contains(environ, secret) {
				t.Errorf("the mount's argv or environment holds the %s", what)
			}
		}
		// They are in 0600 files in its working directory.
		cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range seaweed.MountConfigFiles {
			st, err := os.Stat(filepath.Join(cwd, f))
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("%s in the mount's working directory: %v, want 0600", f, err)
			}
		}
	})

	t.Run("a mount without credentials is refused", func(t *testing.T) {
		for name, env := range map[string][]string{
			"none": nil,
			// The cluster's CA and read key, a client certificate of
			// another cluster's CA.
			"another CA's": otherCreds(t, b.creds).Env(),
		} {
			bare := seaweedfs.New(seaweedfs.Config{Bin: b.env.Bin, FilerAddr: b.env.Cluster.FilerAddr(), Env: env,
				StateDir: filepath.Join(b.root, "state-bare")})
			target := filepath.Join(b.root, "bare-"+strings.Fields(name)[0])
			mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := bare.Mount(mctx, v, target, volumes.MountOptions{})
			cancel()
			if err == nil {
				_ = bare.Unmount(ctx, target)
				t.Fatalf("mounting with %s credentials succeeded", name)
			}
			_ = bare.Unmount(ctx, target)
			// Refused by the filer's TLS, not for another reason.
			m := regexp.MustCompile(`\(log (\S+)\)`).FindStringSubmatch(err.Error())
			if m == nil {
				t.Fatalf("mounting with %s credentials: %v (no log named)", name, err)
			}
			log, _ := os.ReadFile(m[1])
			if !bytes.Contains(log, []byte("failed to talk to filer")) {
				t.Errorf("mounting with %s credentials failed, but not at the filer: %v\n%s", name, err, log)
			}
			t.Logf("%s: %s", name, bytes.TrimSpace(log))
		}
	})

	t.Run("read-only mount refuses writes", func(t *testing.T) {
		ro := b.mount(t, v, "node-ro", true)
		testenv.Eventually(t, 20*time.Second, "the file on the read-only mount", func() bool {
			_, err := os.Stat(filepath.Join(ro, "ckpt", "step-1"))
			return err == nil
		})
		err := os.WriteFile(filepath.Join(ro, "new"), []byte("x"), 0o644)
		if err == nil {
			t.Fatal("a write through the read-only mount succeeded")
		}
		if !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EPERM) && !errors.Is(err, syscall.EACCES) {
			t.Fatalf("write through the read-only mount: %v, want EROFS", err)
		}
		sock := seaweedfs.SocketForTest(ro)
		if st, err := os.Stat(sock); err != nil || st.Mode().Type() != os.ModeSocket {
			t.Fatalf("weed mount's control socket %s while mounted: %v (mode %v)", sock, err, st)
		}
		if err := b.drv.Unmount(ctx, ro); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := volumes.MountedAt(ro); ok {
			t.Fatal("still mounted after Unmount")
		}
		if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("weed mount's control socket %s after Unmount: %v, want it gone", sock, err)
		}
		// Unmount takes the credentials away: node-a and node-b keep theirs.
		if left, _ := filepath.Glob(filepath.Join(b.root, "state", "mounts", "*", "client.key")); len(left) != 2 {
			t.Fatalf("client keys left in mount state dirs: %q, want node-a's and node-b's", left)
		}
	})

	t.Run("crashed mount is remounted", func(t *testing.T) {
		old := mountPID(t, b.drv, c)
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, "the file readable after the remount", func() bool {
			_, err := os.ReadFile(filepath.Join(c, "ckpt", "step-1"))
			return err == nil
		})
		if pid := mountPID(t, b.drv, c); pid == old {
			t.Fatalf("the mount process is still pid %d", pid)
		}
	})

	t.Run("delete removes the data", func(t *testing.T) {
		for _, m := range []string{a, c} {
			if err := b.drv.Unmount(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.drv.Delete(ctx, v); err != nil {
			t.Fatal(err)
		}
		if _, err := b.drv.Stats(ctx, v); err == nil {
			t.Fatal("stats of a deleted volume succeeded")
		}
		if err := b.drv.Delete(ctx, v); err != nil {
			t.Fatalf("delete again: %v", err)
		}
	})
}

// TestQuota: a write past the volume's quota fails with ENOSPC.
func TestQuota(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	v := volumes.Volume{ID: "vol_q1", Workspace: "ws_1", Name: "small", QuotaBytes: 2 << 20}
	if err := b.drv.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	m := b.mount(t, v, "q", false)
	if err := os.WriteFile(filepath.Join(m, "fits"), make([]byte, 512<<10), 0o644); err != nil {
		t.Fatalf("a write under the quota: %v", err)
	}
	f, err := os.Create(filepath.Join(m, "too-big"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	var werr error
	for range 16 {
		if _, werr = f.Write(chunk); werr != nil {
			break
		}
	}
	if werr == nil {
		werr = f.Sync()
	}
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("writing 16 MiB into a 2 MiB volume: %v, want ENOSPC", werr)
	}
}

// TestUnmountAllClearsWhatAKilledAgentLeft: a weed mount whose supervisor
// is gone (a killed agent) and was then killed itself leaves a dead FUSE
// mount; a fresh driver's UnmountAll removes it.
func TestUnmountAllClearsWhatAKilledAgentLeft(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	v := volumes.Volume{ID: "vol_s1", Workspace: "ws_1"}
	if err := b.drv.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(b.root, "stale")
	cache := filepath.Join(b.root, "stale-cache")
	for _, d := range []string{target, cache} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Started by hand, as a previous agent would have: no supervisor here.
	cmd := exec.Command(b.env.Bin, b.drv.MountArgs(v, target, cache, volumes.MountOptions{})...)
	cmd.Dir = filepath.Join(b.root, "stale-state")
	if err := b.creds.WriteMountConfig(cmd.Dir); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the hand-made mount", func() bool {
		m, ok, _ := volumes.MountedAt(target)
		return ok && m.FSType == seaweedfs.FSType
	})
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if _, ok, _ := volumes.MountedAt(target); !ok {
		t.Fatal("killing weed mount removed the mount itself; nothing to reconcile")
	}

	fresh := seaweedfs.New(seaweedfs.Config{StateDir: filepath.Join(b.root, "state2")})
	done, err := fresh.UnmountAll(ctx, b.root)
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 1 || done[0] != target {
		t.Fatalf("UnmountAll unmounted %q, want [%s]", done, target)
	}
	if left, _ := volumes.MountsUnder(b.root, "fuse"); len(left) != 0 {
		t.Fatalf("FUSE mounts left under %s: %+v", b.root, left)
	}
	if _, err := os.Lstat(seaweedfs.SocketForTest(target)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the killed mount's control socket after UnmountAll: %v, want it gone", err)
	}
}

// otherCreds are mine with the client certificate and key of another
// cluster's CA.
func otherCreds(t *testing.T, mine seaweed.MountCredentials) seaweed.MountCredentials {
	t.Helper()
	s, err := seaweed.EnsureSecurity(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.MountCredentials()
	if err != nil {
		t.Fatal(err)
	}
	mine.CertPEM, mine.KeyPEM = c.CertPEM, c.KeyPEM
	return mine
}
