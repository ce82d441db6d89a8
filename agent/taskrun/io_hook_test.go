package taskrun

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox"
)

// TestReadResult judges what a container may leave as its result without
// a container: a missing file, a regular one, one over the limit, and
// the files that must never be read through (a symbolic link to a host
// file, a FIFO, a directory).
func TestReadResult(t *testing.T) {
	t.Parallel()
	host := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(host, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		make    func(t *testing.T, p string)
		want    ResultFile
		wantErr string
	}{
		{"missing", func(*testing.T, string) {}, ResultFile{}, ""},
		{"regular", func(t *testing.T, p string) { write(t, p, "42") }, ResultFile{Present: true, Data: []byte("42")}, ""},
		{"empty", func(t *testing.T, p string) { write(t, p, "") }, ResultFile{Present: true, Data: []byte{}}, ""},
		{"at the limit", func(t *testing.T, p string) { write(t, p, strings.Repeat("x", 16)) }, ResultFile{Present: true, Data: []byte(strings.Repeat("x", 16))}, ""},
		{"over the limit", func(t *testing.T, p string) { write(t, p, strings.Repeat("x", 17)) }, ResultFile{}, "the result is 17 bytes; the limit is 16 B"},
		{"symlink to a host file", func(t *testing.T, p string) {
			if err := os.Symlink(host, p); err != nil {
				t.Fatal(err)
			}
		}, ResultFile{}, "symbolic link"},
		{"fifo", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o666); err != nil {
				t.Fatal(err)
			}
		}, ResultFile{}, "the result is a FIFO"},
		{"directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}, ResultFile{}, "the result is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			tc.make(t, filepath.Join(dir, resultFile))
			done := make(chan ResultFile, 1)
			go func() { done <- readResult(dir, 16) }()
			var got ResultFile
			select {
			case got = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("readResult blocked")
			}
			if tc.wantErr != "" {
				if got.Present || got.Data != nil || !strings.Contains(got.Err, tc.wantErr) {
					t.Fatalf("readResult = %+v, want not present with an error containing %q", got, tc.wantErr)
				}
				return
			}
			if got.Present != tc.want.Present || string(got.Data) != string(tc.want.Data) || got.Err != "" ||
				(tc.want.Data != nil && got.Data == nil) {
				t.Fatalf("readResult = %+v, want %+v", got, tc.want)
			}
		})
	}
	if got := readResult(filepath.Join(t.TempDir(), "gone"), 16); got.Present || got.Err != "" {
		t.Errorf("readResult of a missing directory = %+v, want nothing", got)
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestIOHookWithoutDir: a Runner without an IODir refuses a task with
// input and leaves others alone.
func TestIOHookWithoutDir(t *testing.T) {
	h := newIOHook("", Task{ID: "t", Attempt: 1}, DefaultMaxResultBytes)
	var resp PrestartResponse
	if err := h.Prestart(context.Background(), &PrestartRequest{Task: Task{ID: "t", Attempt: 1}}, &resp); err != nil || len(resp.Mounts) != 0 {
		t.Fatalf("Prestart without input = %v, %+v", err, resp.Mounts)
	}
	err := h.Prestart(context.Background(), &PrestartRequest{Task: Task{ID: "t", Attempt: 1, Input: []byte("x")}}, &resp)
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Prestart with input = %v, want failed precondition", err)
	}
	big := Task{ID: "t", Attempt: 1, Input: make([]byte, MaxInputBytes+1)}
	if err := newIOHook(t.TempDir(), big, DefaultMaxResultBytes).Prestart(context.Background(), &PrestartRequest{Task: big}, &resp); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Prestart with %d bytes of input = %v, want invalid argument", len(big.Input), err)
	}
}

// ioCase is one container's use of its io directory.
type ioCase struct {
	name   string
	user   string
	input  string
	script string
	// want is the result's content when present; wantErr a part of its
	// error otherwise; neither: no result.
	want    string
	wantErr string
	// gvisorNone: under runsc the host sees no result at all (gVisor
	// keeps a FIFO made in a gofer mount in its sentry).
	gvisorNone bool
}

// ioCases are the io directory's cases; host is a host file the
// container must not get the agent to read.
func ioCases(host string) []ioCase {
	return []ioCase{
		{"input uppercased", "", "hello from the input\n", `tr a-z A-Z < /run/levers9/io/input > /run/levers9/io/result`, "HELLO FROM THE INPUT\n", "", false},
		{"no result", "", "ignored", `cat /run/levers9/io/input`, "", "", false},
		{"no input", "", "", `[ -e /run/levers9/io/input ] && echo there > /run/levers9/io/result || echo absent > /run/levers9/io/result`, "absent\n", "", false},
		{"the input is read-only", "nobody", "x", `echo y >> /run/levers9/io/input 2>/dev/null && echo wrote > /run/levers9/io/result || echo refused > /run/levers9/io/result`, "refused\n", "", false},
		{"a non-root user writes", "nobody", "in", `{ id -u; cat /run/levers9/io/input; } > /run/levers9/io/result`, "65534\nin", "", false},
		{"mount options", "", "", `grep ' /run/levers9/io ' /proc/mounts > /run/levers9/io/result`, "", "", false},
		{"noexec", "", "", `cp /bin/busybox /run/levers9/io/bb && /run/levers9/io/bb true 2>/dev/null && echo ran > /run/levers9/io/result || echo refused > /run/levers9/io/result`, "refused\n", "", false},
		{"symlink to a host file", "", "", `ln -s ` + host + ` /run/levers9/io/result`, "", "symbolic link", false},
		{"fifo", "", "", `mkfifo /run/levers9/io/result`, "", "the result is a FIFO", true},
		{"too large", "", "", `head -c 8388609 /dev/zero > /run/levers9/io/result`, "", "the result is 8388609 bytes; the limit is 8 MiB", false},
	}
}

// run runs tc in a container of runtime and checks its result and that
// nothing of the attempt is left.
func (tc ioCase) run(t *testing.T, b *bundle, runtime sandbox.RuntimeName) {
	tk := b.task(strings.ReplaceAll(tc.name, " ", "-")+"-"+string(runtime), tc.script)
	tk.User, tk.Input, tk.Security.Runtime = tc.user, []byte(tc.input), runtime
	if tc.input == "" {
		tk.Input = nil
	}
	var rec recorder
	ctx, cancel := context.WithTimeout(testCtx(t), 60*time.Second)
	defer cancel()
	res, err := b.runner.Run(ctx, tk, rec.output())
	if err != nil || res.State != StateSucceeded {
		t.Fatalf("Run = %+v, %v; want SUCCEEDED (stderr %q)", res, err, rec.texts(Stderr))
	}
	got := res.Result
	switch {
	case tc.name == "mount options":
		if !got.Present {
			t.Fatalf("no mount line: %+v", got)
		}
		line := string(got.Data)
		opts := []string{"rw", "noexec"}
		if runtime == sandbox.RuntimeRunc {
			// gVisor's /proc/mounts omits nosuid and nodev (see README
			// "Volumes"); noexec, which it shows and enforces, leaves
			// nothing in the directory to run, setuid or not.
			opts = append(opts, "nosuid", "nodev")
		}
		for _, o := range opts {
			if !strings.Contains(line, o) {
				t.Errorf("io mount %q lacks %s", line, o)
			}
		}
	case tc.gvisorNone && runtime == sandbox.RuntimeRunsc:
		if got.Present || got.Err != "" {
			t.Errorf("result = %+v, want none", got)
		}
	case tc.wantErr != "":
		if got.Present || len(got.Data) != 0 || !strings.Contains(got.Err, tc.wantErr) {
			t.Errorf("result = present %v, %d bytes, %q; want an error containing %q", got.Present, len(got.Data), got.Err, tc.wantErr)
		}
	case tc.want != "":
		if !got.Present || string(got.Data) != tc.want || got.Err != "" {
			t.Errorf("result = %+v, want %q", got, tc.want)
		}
	default:
		if got.Present || got.Err != "" {
			t.Errorf("result = %+v, want none", got)
		}
	}
	b.assertClean(t, tk)
}

// hostSecret is a host file a container names as its result.
func hostSecret(t *testing.T) string {
	host := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(host, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	return host
}

// TestIOHook runs real containers with runc: the input is a read-only
// file at /run/levers9/io/input, the result comes back, a non-root task
// user can write it, the directory is nosuid,nodev,noexec, a result that
// is a symbolic link to a host file or a FIFO is refused without the
// agent reading the host file or blocking, one over 8 MiB is reported as
// too large, and nothing of the directory is left once the attempt ends.
func TestIOHook(t *testing.T) {
	b := setup(t, setupOpts{})
	for _, tc := range ioCases(hostSecret(t)) {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, b, sandbox.RuntimeRunc) })
	}
}

// TestIOHookRunsc is TestIOHook under gVisor: its gofer serves the bind
// mount, and the same holds.
func TestIOHookRunsc(t *testing.T) {
	testenv.RequireBinary(t, "runsc")
	b := setup(t, setupOpts{})
	for _, tc := range ioCases(hostSecret(t)) {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, b, sandbox.RuntimeRunsc) })
	}
}

// TestIOHookAcrossRestart: an agent that restarts while the container
// runs (Stop detaches, a new Runner recovers and resumes) still reads the
// result the container writes after the restart, and removes the
// directory after.
func TestIOHookAcrossRestart(t *testing.T) {
	b := setup(t, setupOpts{})
	tk := b.task("io-restart", `while [ ! -e /run/levers9/io/go ]; do sleep 0.1; done; tr a-z A-Z < /run/levers9/io/input > /run/levers9/io/result`)
	tk.Input = []byte("survives\n")
	var rec recorder
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(testCtx(t), tk, rec.output())
		done <- err
	}()
	testenv.Eventually(t, 20*time.Second, "RUNNING", func() bool {
		a := b.runner.Attempts()
		return len(a) == 1 && a[0].State == StateRunning
	})
	b.runner.Stop()
	if err := <-done; !errors.Is(err, ErrDetached) {
		t.Fatalf("Run after Stop: %v, want ErrDetached", err)
	}
	// The new agent has a sandbox of its own, as a new process would.
	host, err := sandbox.DetectHost(testCtx(t), sandbox.NVIDIADiscovery{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := b.cfg
	if cfg.Sandbox, err = sandbox.New(sandbox.Config{Prefix: testPrefix, StateDir: testStateDir, CgroupParent: testCgroup, Host: host, Logger: cfg.Logger}); err != nil {
		t.Fatal(err)
	}
	r2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	found, lost, err := r2.Recover(testCtx(t))
	if err != nil || len(found) != 1 || len(lost) != 0 {
		t.Fatalf("Recover = %+v, %+v, %v; want the attempt found", found, lost, err)
	}
	if err := r2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r2.Stop()
	dir := filepath.Join(b.cfg.IODir, tk.runID())
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatalf("the io directory did not survive the restart: %v", err)
	}
	res, err := r2.Resume(testCtx(t), found[0], rec.output())
	if err != nil || res.State != StateSucceeded {
		t.Fatalf("Resume = %+v, %v", res, err)
	}
	if !res.Result.Present || string(res.Result.Data) != "SURVIVES\n" {
		t.Fatalf("result after the restart = %+v", res.Result)
	}
	b.assertClean(t, tk)
}

// TestIODirsReconciled: Reconcile removes io directories a killed agent
// left.
func TestIODirsReconciled(t *testing.T) {
	b := setup(t, setupOpts{})
	left := filepath.Join(b.cfg.IODir, "gone.1")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(left, resultFile), "stale")
	if _, err := b.runner.Reconcile(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("a leftover io directory survived Reconcile: %v", err)
	}
}
