package procstat

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	rest := " 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 12345 1000 10"
	for _, tt := range []struct {
		in      string
		state   byte
		start   uint64
		cpu     uint64
		wantErr bool
	}{
		{"42 (sleep) S" + rest, 'S', 12345, 3, false},
		{"42 (a) b) (c) Z" + rest, 'Z', 12345, 3, false},
		{"42 (x y) R" + rest, 'R', 12345, 3, false},
		{"42 sleep S" + rest, 0, 0, 0, true},
		{"42 (sleep) S 1 1", 0, 0, 0, true},
		{"42 (sleep) SS" + rest, 0, 0, 0, true},
		{"42 (sleep) S 1 1 1 0 -1 4194560 100 0 0 0 x 2 0 0 20 0 1 0 12345 1000 10", 0, 0, 0, true},
	} {
		got, err := parse(42, tt.in)
		if (err != nil) != tt.wantErr || got.State != tt.state || got.StartTime != tt.start || got.CPUTicks != tt.cpu {
			t.Errorf("parse(%q) = %+v, %v", tt.in, got, err)
		}
	}
}

// A real process: running, then killed and not reaped (a zombie), with the
// same start time throughout.
func TestReadLiveAndZombie(t *testing.T) {
	if st, err := Read(os.Getpid()); err != nil || st.Exited() || st.StartTime == 0 {
		t.Fatalf("this process: %+v %v", st, err)
	}
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	live, err := Read(cmd.Process.Pid)
	if err != nil || live.Exited() {
		t.Fatalf("running sleep: %+v %v", live, err)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := Read(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if st.Exited() {
			if st.StartTime != live.StartTime {
				t.Errorf("start time changed: %d then %d", live.StartTime, st.StartTime)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("killed sleep never exited: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// This process's CPU time grows by what it spends spinning.
func TestReadCPU(t *testing.T) {
	before, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for spin := time.Now(); time.Since(spin) < 300*time.Millisecond; {
	}
	after, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if used := after.CPU() - before.CPU(); used < 100*time.Millisecond || used > 5*time.Second {
		t.Errorf("300 ms of spinning counted as %v of CPU", used)
	}
}
