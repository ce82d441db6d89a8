package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/testenv"
)

var bothRuntimes = []RuntimeName{RuntimeRunc, RuntimeRunsc}

// setupRuntimes skips (fails under CI) without root or the named runtime
// binaries, and returns a sandbox and a rootfs without a probe.
func setupRuntimes(t *testing.T, binaries ...string) (bundle, string) {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, binaries...)
	return setupSandbox(t), makeRootfs(t, "")
}

// forEachRuntime runs f as a subtest per runtime, each with a context that
// ends after 30 seconds.
func forEachRuntime(t *testing.T, f func(t *testing.T, ctx context.Context, rt RuntimeName)) {
	for _, rt := range bothRuntimes {
		t.Run(string(rt), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			f(t, ctx, rt)
		})
	}
}

func TestRunExitCodeAndOutput(t *testing.T) {
	b, rootfs := setupRuntimes(t, "runc", "runsc")
	forEachRuntime(t, func(t *testing.T, ctx context.Context, rt RuntimeName) {
		var out, errb testenv.SyncBuffer
		task := TaskSpec{ID: "exit-" + string(rt), Rootfs: rootfs, Args: []string{"sh", "-c", "echo hello $GREETING; echo oops >&2; exit 7"}, Env: []string{"GREETING=world"}}
		h, err := b.sb.Run(ctx, task, Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, DropNetRaw: true, Runtime: rt}, Stdio{Stdout: &out, Stderr: &errb})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Delete(context.Background()) })
		st, err := h.Wait(ctx)
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
		if st.Code != 7 {
			t.Errorf("exit code %d, want 7", st.Code)
		}
		if got := out.String(); got != "hello world\n" {
			t.Errorf("stdout %q", got)
		}
		if got := errb.String(); !strings.Contains(got, "oops") {
			t.Errorf("stderr %q", got)
		}
		if s, err := h.State(ctx); err != nil || s.Status != StatusStopped {
			t.Errorf("state after exit: %+v %v", s, err)
		}
		if err := h.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		if err := h.Delete(ctx); err != nil {
			t.Errorf("second delete: %v", err)
		}
		if _, err := os.Stat(filepath.Join("/run/l9s-test", h.ID)); !os.IsNotExist(err) {
			t.Errorf("container dir left: %v", err)
		}
	})
}

func TestKillAndCgroupLimits(t *testing.T) {
	b, rootfs := setupRuntimes(t, "runc", "runsc")
	forEachRuntime(t, func(t *testing.T, ctx context.Context, rt RuntimeName) {
		task := TaskSpec{ID: "kill-" + string(rt), Rootfs: rootfs, Args: []string{"sleep", "60"},
			Resources: Resources{CPUMillis: 500, MemoryBytes: 64 << 20, Pids: 32}}
		h, err := b.sb.Run(ctx, task, Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: rt}, Stdio{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Delete(context.Background()) })
		testenv.Eventually(t, 10*time.Second, "running", func() bool {
			s, err := h.State(ctx)
			return err == nil && s.Status == StatusRunning
		})
		cg := "/l9s-test/" + h.ID
		want := map[string]string{
			"memory/" + cg + "/memory.limit_in_bytes": "67108864",
			"pids/" + cg + "/pids.max":                "32",
			// 500 mCPU: half a core's shares, a one-core cap.
			"cpu/" + cg + "/cpu.cfs_quota_us": "100000",
			"cpu/" + cg + "/cpu.shares":       "512",
		}
		for f, v := range want {
			got, err := os.ReadFile("/sys/fs/cgroup/" + f)
			if err != nil {
				t.Errorf("cgroup %s: %v", f, err)
				continue
			}
			if strings.TrimSpace(string(got)) != v {
				t.Errorf("cgroup %s = %q, want %s", f, got, v)
			}
		}
		if err := h.Kill(ctx, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		st, err := h.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Code != 137 {
			t.Errorf("exit %+v, want 137", st)
		}
	})
}

func TestRuntimeErrors(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc")
	b := setupSandbox(t)
	ctx := context.Background()
	rt, err := b.sb.Runtime(RuntimeRunc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.State(ctx, "l9s-nope"); !errdefs.IsNotFound(err) || errdefs.IsRetryable(err) {
		t.Errorf("state of unknown container: %v (retryable %v)", err, errdefs.IsRetryable(err))
	}
	rootfs := makeRootfs(t, "")
	_, err = b.sb.Run(ctx, TaskSpec{ID: "noexec", Rootfs: rootfs, Args: []string{"/no/such/binary"}}, Security{Runtime: RuntimeRunc}, Stdio{})
	if err == nil {
		t.Fatal("running a missing binary succeeded")
	}
	if errdefs.IsRetryable(err) {
		t.Errorf("missing binary is retryable: %v", err)
	}
	if !strings.Contains(err.Error(), "/no/such/binary") {
		t.Errorf("error does not name the binary: %v", err)
	}
}

// TestRuntimeLifecycle drives the Runtime interface step by step.
func TestRuntimeLifecycle(t *testing.T) {
	b, rootfs := setupRuntimes(t, "runc", "runsc")
	forEachRuntime(t, func(t *testing.T, ctx context.Context, name RuntimeName) {
		rt, err := b.sb.Runtime(name)
		if err != nil {
			t.Fatal(err)
		}
		spec, _, err := BuildSpec(TaskSpec{ID: "life", Rootfs: rootfs, Args: []string{"sleep", "60"}}, Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: name}, b.host)
		if err != nil {
			t.Fatal(err)
		}
		id := "l9s-life-" + string(name)
		spec.Linux.CgroupsPath = "/l9s-test/" + id
		bundle := filepath.Join(t.TempDir(), "bundle")
		if err := writeBundle(bundle, spec); err != nil {
			t.Fatal(err)
		}
		opts := CreateOpts{Bundle: bundle, OwnNetwork: true}
		if err := rt.Create(ctx, id, opts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Delete(context.Background(), id) })
		if err := rt.Create(ctx, id, opts); !errdefs.IsAlreadyExists(err) {
			t.Errorf("second create: %v", err)
		}
		if st, err := rt.State(ctx, id); err != nil || st.Status != StatusCreated {
			t.Errorf("state after create: %+v %v", st, err)
		}
		if _, err := rt.Wait(ctx, id); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("wait before start: %v", err)
		}
		if err := rt.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := rt.Start(ctx, id); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("second start: %v", err)
		}
		testenv.Eventually(t, 10*time.Second, "running", func() bool {
			st, err := rt.State(ctx, id)
			return err == nil && st.Status == StatusRunning && st.Pid > 0
		})
		shortCtx, c2 := context.WithTimeout(ctx, 50*time.Millisecond)
		if _, err := rt.Wait(shortCtx, id); !errdefs.IsCanceled(err) {
			t.Errorf("wait on a running container with a short ctx: %v", err)
		}
		c2()
		// SIGKILL: the container's pid 1 ignores signals it has
		// no handler for.
		if err := rt.Kill(ctx, id, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		st, err := rt.Wait(ctx, id)
		if err != nil || st.Signal != syscall.SIGKILL || st.Code != 137 {
			t.Errorf("exit after SIGKILL: %+v %v", st, err)
		}
		if err := rt.Kill(ctx, id, syscall.SIGKILL); err != nil {
			t.Errorf("kill after exit: %v", err)
		}
		if err := rt.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.State(ctx, id); !errdefs.IsNotFound(err) {
			t.Errorf("state after delete: %v", err)
		}
	})
}

// TestReconcileRemovesLeftovers starts containers with one Sandbox, drops
// it as a killed agent would, and checks a fresh Sandbox's Reconcile
// kills and removes them, their state and their cgroups.
func TestReconcileRemovesLeftovers(t *testing.T) {
	b, rootfs := setupRuntimes(t, "runc", "runsc")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var pids []int
	for _, rt := range bothRuntimes {
		h, err := b.sb.Run(ctx, TaskSpec{ID: "orphan-" + string(rt), Rootfs: rootfs, Args: []string{"sleep", "600"}}, Security{Runtime: rt}, Stdio{})
		if err != nil {
			t.Fatal(err)
		}
		var st State
		testenv.Eventually(t, 10*time.Second, "running", func() bool {
			st, err = h.State(ctx)
			return err == nil && st.Status == StatusRunning
		})
		pids = append(pids, st.Pid)
	}
	fresh, err := New(Config{StateDir: "/run/l9s-test", CgroupParent: "/l9s-test", Host: b.host})
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		testenv.Eventually(t, 10*time.Second, "leftover process gone", func() bool {
			return syscall.Kill(pid, 0) != nil
		})
	}
	if _, err := os.Stat("/run/l9s-test"); !os.IsNotExist(err) {
		t.Errorf("state dir still there: %v", err)
	}
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*/l9s-test/l9s-orphan-*"); len(dirs) > 0 {
		t.Errorf("cgroups left: %v", dirs)
	}
}

// TestReconcileRuncLeftoverIsQuick: a runc leftover (kept by `run --keep`
// once stopped) is removed at once, not after waiting seconds for it to
// disappear by itself. A restarted agent reconciles before it connects,
// so every leftover delayed it (four took 40 s, past lostAgentGrace, in
// test/chaos).
func TestReconcileRuncLeftoverIsQuick(t *testing.T) {
	b, rootfs := setupRuntimes(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h, err := b.sb.Run(ctx, TaskSpec{ID: "quick", Rootfs: rootfs, Args: []string{"sleep", "600"}}, Security{Runtime: RuntimeRunc}, Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "running", func() bool {
		st, err := h.State(ctx)
		return err == nil && st.Status == StatusRunning
	})
	fresh, err := New(Config{StateDir: "/run/l9s-test", CgroupParent: "/l9s-test", Host: b.host})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := fresh.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("reconciling one runc leftover took %s", took.Round(time.Millisecond))
	}
}

// TestReleaseCgroups: an agent leaving removes its cgroup parent once no
// container is in it, and leaves it while one runs.
func TestReleaseCgroups(t *testing.T) {
	b, rootfs := setupRuntimes(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h, err := b.sb.Run(ctx, TaskSpec{ID: "release", Rootfs: rootfs, Args: []string{"sleep", "600"}}, Security{Runtime: RuntimeRunc}, Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Delete(context.Background()) })
	testenv.Eventually(t, 10*time.Second, "running", func() bool {
		st, err := h.State(ctx)
		return err == nil && st.Status == StatusRunning
	})
	b.sb.ReleaseCgroups()
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*/l9s-test/l9s-release"); len(dirs) == 0 {
		t.Fatal("the running container's cgroups went")
	}
	if err := h.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*/l9s-test"); len(dirs) == 0 {
		t.Fatal("no parent cgroup before the release: the test proves nothing")
	}
	b.sb.ReleaseCgroups()
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*/l9s-test"); len(dirs) > 0 {
		t.Errorf("parent cgroups left: %v", dirs)
	}
}

func TestConcurrentRuns(t *testing.T) {
	b, rootfs := setupRuntimes(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out testenv.SyncBuffer
			h, err := b.sb.Run(ctx, TaskSpec{ID: "conc-" + strconv.Itoa(i), Rootfs: rootfs, Args: []string{"echo", strconv.Itoa(i)}}, Security{Runtime: RuntimeRunc}, Stdio{Stdout: &out})
			if err != nil {
				errs <- err
				return
			}
			defer h.Delete(context.Background())
			if st, err := h.Wait(ctx); err != nil || st.Code != 0 || out.String() != strconv.Itoa(i)+"\n" {
				errs <- fmt.Errorf("container %d: %+v %v %q", i, st, err, out.String())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestMissingRuntimeBinary(t *testing.T) {
	sb, err := New(Config{StateDir: t.TempDir(), RuncPath: "/nonexistent/runc", RunscPath: "/nonexistent/runsc"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.Run(context.Background(), TaskSpec{ID: "t", Rootfs: "/x", Args: []string{"true"}}, Security{Runtime: RuntimeRunc}, Stdio{})
	if !errdefs.IsFailedPrecondition(err) || errdefs.IsRetryable(err) {
		t.Errorf("run without runc: %v", err)
	}

	// A binary that disappears between lookup and start fails Start, and
	// Wait does not hang on it.
	dir := t.TempDir()
	bin := filepath.Join(dir, "runc")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := NewOCI(RuntimeRunc, bin, filepath.Join(dir, "state"), nil)
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle")
	if err := writeBundle(bundle, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Create(context.Background(), "l9s-gone", CreateOpts{Bundle: bundle}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background(), "l9s-gone"); err == nil {
		t.Fatal("start with a vanished binary succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rt.Wait(ctx, "l9s-gone"); err == nil || errdefs.IsCanceled(err) {
		t.Errorf("wait after failed start: %v", err)
	}
	if err := rt.Delete(ctx, "l9s-gone"); err != nil {
		t.Errorf("delete after failed start: %v", err)
	}
}

// TestGlobalArgsVolumes: runsc gets shared file access for bind mounts (a
// volume's files change on other machines while a task runs) and no
// --overlay2 that could wrap a bind mount and keep a task's writes inside
// the sandbox; runc gets neither.
func TestGlobalArgsVolumes(t *testing.T) {
	for _, tc := range []struct {
		rt         RuntimeName
		wantShared bool
	}{{RuntimeRunsc, true}, {RuntimeRunc, false}} {
		t.Run(string(tc.rt), func(t *testing.T) {
			r := &OCI{name: tc.rt}
			args := r.globalArgs("/run/x/c", CreateOpts{OwnNetwork: true})
			if got := slices.Contains(args, "--file-access-mounts=shared"); got != tc.wantShared {
				t.Errorf("args %q: --file-access-mounts=shared %v, want %v", args, got, tc.wantShared)
			}
			for _, a := range args {
				if strings.HasPrefix(a, "--overlay") || strings.HasPrefix(a, "--file-access-mounts=exclusive") {
					t.Errorf("args %q: %s", args, a)
				}
			}
		})
	}
}
