package sandbox

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDirWaker: creating and appending to a file in the directory each
// signal; a quiet directory does not; a missing one is an error.
func TestDirWaker(t *testing.T) {
	dir := t.TempDir()
	w, err := watchDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	quiet := func(what string) {
		t.Helper()
		select {
		case <-w.C:
			t.Fatalf("%s: a signal with nothing written", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
	woken := func(what string) {
		t.Helper()
		select {
		case <-w.C:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no signal", what)
		}
	}
	quiet("before")
	p := filepath.Join(dir, "stdout")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	woken("create")
	// Let the create's events all arrive, then drain them.
	time.Sleep(50 * time.Millisecond)
	select {
	case <-w.C:
	default:
	}
	quiet("after create")
	if _, err := f.WriteString("hi\n"); err != nil {
		t.Fatal(err)
	}
	woken("append")

	if _, err := watchDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("watching a missing directory: no error")
	}
}
