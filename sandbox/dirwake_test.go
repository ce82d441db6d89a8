package sandbox

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDirWatch: creating and appending to a file in a watched directory
// signal that directory's channel only; a quiet directory does not; a
// missing one is an error; the instance closes with its last watch and
// opens again for the next.
func TestDirWatch(t *testing.T) {
	var w dirWatch
	dirA, dirB := t.TempDir(), t.TempDir()
	wakeA, stopA, err := w.add(dirA)
	if err != nil {
		t.Fatal(err)
	}
	wakeB, stopB, err := w.add(dirB)
	if err != nil {
		t.Fatal(err)
	}
	quiet := func(what string, wake <-chan struct{}) {
		t.Helper()
		select {
		case <-wake:
			t.Fatalf("%s: a signal with nothing written", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
	woken := func(what string, wake <-chan struct{}) {
		t.Helper()
		select {
		case <-wake:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no signal", what)
		}
	}
	quiet("before", wakeA)
	f, err := os.OpenFile(filepath.Join(dirA, "stdout"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	woken("create", wakeA)
	// Let the create's events all arrive, then drain them.
	time.Sleep(50 * time.Millisecond)
	select {
	case <-wakeA:
	default:
	}
	quiet("after create", wakeA)
	if _, err := f.WriteString("hi\n"); err != nil {
		t.Fatal(err)
	}
	woken("append", wakeA)
	quiet("the other directory", wakeB)

	if _, _, err := w.add(filepath.Join(dirA, "missing")); err == nil {
		t.Error("watching a missing directory: no error")
	}
	stopA()
	stopB()
	if w.f != nil {
		t.Fatal("the inotify instance outlived its last watch")
	}
	wakeB, stopB, err = w.add(dirB)
	if err != nil {
		t.Fatal(err)
	}
	defer stopB()
	if err := os.WriteFile(filepath.Join(dirB, "exit"), []byte("0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	woken("after reopening", wakeB)
}
