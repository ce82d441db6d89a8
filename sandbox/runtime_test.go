package sandbox

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/testenv"
)

// syncBuffer is a bytes.Buffer safe to write from the runtime's copier
// goroutine while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var bothRuntimes = []RuntimeName{RuntimeRunc, RuntimeRunsc}

func TestRunExitCodeAndOutput(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc", "runsc")
	b := setupSandbox(t)
	rootfs := makeRootfs(t, "")
	for _, rt := range bothRuntimes {
		t.Run(string(rt), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var out, errb syncBuffer
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
}

func TestKillAndCgroupLimits(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc", "runsc")
	b := setupSandbox(t)
	rootfs := makeRootfs(t, "")
	for _, rt := range bothRuntimes {
		t.Run(string(rt), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			task := TaskSpec{ID: "kill-" + string(rt), Rootfs: rootfs, Args: []string{"sleep", "60"},
				Resources: Resources{CPUMillis: 500, MemoryBytes: 64 << 20, Pids: 32}}
			h, err := b.sb.Run(ctx, task, Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: rt}, Stdio{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = h.Delete(context.Background()) })
			waitFor(t, 10*time.Second, "running", func() bool {
				s, err := h.State(ctx)
				return err == nil && s.Status == StatusRunning
			})
			cg := "/l9s-test/" + h.ID
			want := map[string]string{
				"memory/" + cg + "/memory.limit_in_bytes": "67108864",
				"pids/" + cg + "/pids.max":                "32",
				"cpu/" + cg + "/cpu.cfs_quota_us":         "50000",
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
