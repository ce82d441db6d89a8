package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
)

// waitFile waits for path to hold want.
func waitFile(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if string(b) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %q, want %q", filepath.Base(path), b, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHolderRunsItsCommandLine: a holder started ahead runs the command
// line it is handed, argument by argument (spaces, quotes and shell
// characters stay whole), with the output and the exit status in the
// directory's files.
func TestHolderRunsItsCommandLine(t *testing.T) {
	var hs holders
	defer hs.close()
	h, err := hs.take()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	args := []string{"/bin/sh", "-c", `printf '%s|' "$@"; echo oops >&2; exit 3`, "sh", "a b", `'q"`, "$HOME", "*"}
	if err := h.run(dir, args); err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	waitFile(t, filepath.Join(dir, stdoutFile), `a b|'q"|$HOME|*|`)
	waitFile(t, filepath.Join(dir, stderrFile), "oops\n")
	if code, ok := readExit(filepath.Join(dir, exitFile)); !ok || code != 3 {
		t.Errorf("exit file: %d %v, want 3", code, ok)
	}
}

// TestHolderSpare: after a start the next holder is waiting before it is
// needed; take hands it out; close ends a spare that got nothing to run.
func TestHolderSpare(t *testing.T) {
	var hs holders
	hs.fill()
	deadline := time.Now().Add(10 * time.Second)
	var spare *holder
	for spare == nil {
		hs.mu.Lock()
		spare = hs.spare
		hs.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("no spare holder was started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	h, err := hs.take()
	if err != nil || h != spare {
		t.Fatalf("take = %p, %v; want the spare %p", h, err, spare)
	}
	h.discard()
	hs.fill()
	hs.close()
	hs.mu.Lock()
	left := hs.spare
	hs.mu.Unlock()
	if left != nil {
		t.Error("a spare is kept after close")
	}
	hs.fill()
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.refilling {
		t.Error("fill after close starts a holder")
	}
}

// TestHolderRefusesNewlines: the holder reads one argument per line, so an
// argument with a newline is refused rather than split.
func TestHolderRefusesNewlines(t *testing.T) {
	var hs holders
	defer hs.close()
	h, err := hs.take()
	if err != nil {
		t.Fatal(err)
	}
	err = h.run(t.TempDir(), []string{"/bin/echo", "two\nlines"})
	if !errors.Is(err, errInvalidHolderArg) || !strings.Contains(err.Error(), "newline") {
		t.Fatalf("run = %v, want a refused argument", err)
	}
}

// TestStartAfterSpareDied: a spare holder killed while it waited does not
// fail the next start; it runs under a new holder.
func TestStartAfterSpareDied(t *testing.T) {
	b, rootfs := setupRuntimes(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rt, err := b.sb.Runtime(RuntimeRunc)
	if err != nil {
		t.Fatal(err)
	}
	oci := rt.(*OCI)
	spare, err := spawnHolder()
	if err != nil {
		t.Fatal(err)
	}
	oci.holders.mu.Lock()
	oci.holders.spare = spare
	oci.holders.mu.Unlock()
	if err := spare.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = spare.cmd.Wait() // dead before the start hands it the container
	var out testenv.SyncBuffer
	h, err := b.sb.Run(ctx, TaskSpec{ID: "spare-died", Rootfs: rootfs, Args: []string{"echo", "started"}},
		Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, DropNetRaw: true, Runtime: RuntimeRunc}, Stdio{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Delete(context.Background()) }()
	if st, err := h.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("wait: %+v %v", st, err)
	}
	if got := out.String(); got != "started\n" {
		t.Errorf("stdout %q", got)
	}
}
