package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type seccompRecorder struct {
	r *SeccompLogReader
	// mu guards events.
	mu     sync.Mutex
	events []SeccompEvent
}

// syscallsOf returns the syscalls attributed to a container and to the
// task the sandbox said it runs.
func (s *seccompRecorder) syscallsOf(containerID string) map[int]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]bool{}
	for _, e := range s.events {
		if e.ContainerID == containerID && "l9s-"+e.TaskID == containerID {
			out[e.Syscall] = true
		}
	}
	return out
}

func setupSeccompReader(t *testing.T) *seccompRecorder {
	t.Helper()
	rec := &seccompRecorder{}
	r, err := NewSeccompLogReader(SeccompLogConfig{Prefix: "l9s", Registerer: prometheus.NewRegistry(), OnEvent: func(e SeccompEvent) {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		rec.events = append(rec.events, e)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	rec.r = r
	return rec
}

// checkSeccompLog asserts the kernel logged, and the reader attributed to
// the container, every syscall probes.tsv says log mode must record.
func checkSeccompLog(t *testing.T, rec *seccompRecorder, containerID string, tab probeTable, c probeCombo) {
	t.Helper()
	for name, nr := range tab.logged {
		deadline := time.Now().Add(5 * time.Second)
		for !rec.syscallsOf(containerID)[nr] {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no kernel record of %s (syscall %d); saw %v", c, name, nr, rec.syscallsOf(containerID))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if rec.r.Count(containerID) == 0 {
		t.Errorf("%s: no seccomp records counted for %s", c, containerID)
	}
	if got := testutil.ToFloat64(rec.r.counter.WithLabelValues("true")); got < float64(len(tab.logged)) {
		t.Errorf("%s: attributed counter %v, want >= %d", c, got, len(tab.logged))
	}
}

func TestParseSeccompRecord(t *testing.T) {
	for _, tc := range []struct {
		rec  string
		ok   bool
		want SeccompEvent
	}{
		{`5,1234,567890,-;audit: type=1326 audit(1701500000.123:45): auid=4294967295 uid=0 gid=0 ses=4294967295 subj=unconfined pid=4242 comm="probe x" exe="/probe" sig=0 arch=c000003e syscall=248 compat=0 ip=0x4a2b3c code=0x7ffc0000`,
			true, SeccompEvent{Pid: 4242, Syscall: 248, Arch: "c000003e", Comm: "probe x", Exe: "/probe"}},
		{`6,1,2,-;audit: type=1300 audit(1:2): pid=1 syscall=2`, false, SeccompEvent{}},
		{`no semicolon type=1326 pid=1 syscall=2`, false, SeccompEvent{}},
		{`5,1,2,-;audit: type=1326 audit(1:2): comm="x" syscall=3`, false, SeccompEvent{}},
	} {
		got, ok := parseSeccompRecord(tc.rec)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parse %q = %+v %v, want %+v %v", tc.rec, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzParseSeccompRecord(f *testing.F) {
	f.Add(`5,1234,567890,-;audit: type=1326 audit(1701500000.123:45): pid=4242 comm="probe" exe="/probe" arch=c000003e syscall=248`)
	f.Add(`6,1,2,-;hello`)
	f.Add(`;type=1326 pid="" syscall=`)
	f.Fuzz(func(t *testing.T, rec string) {
		ev, ok := parseSeccompRecord(rec)
		if ok && (ev.Pid <= 0 || ev.Syscall < 0) {
			t.Fatalf("accepted %q as %+v", rec, ev)
		}
	})
}

func TestSeccompLogReaderStartStop(t *testing.T) {
	testenv.RequireRoot(t)
	r, err := NewSeccompLogReader(SeccompLogConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r.Stop() // before Start
	for i := 0; i < 20; i++ {
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err == nil {
			t.Fatal("second Start succeeded")
		}
		r.Stop()
		r.Stop()
	}
}

func TestContainerOfPid(t *testing.T) {
	proc := t.TempDir()
	write := func(pid, content string) {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10", "12:pids:/l9s/l9s-task1\n4:memory:/l9s/l9s-task1\n")
	write("11", "0::/l9s-test/l9s-task2\n")
	write("12", "0::/system.slice/ssh.service\n")
	for pid, want := range map[int]string{10: "l9s-task1", 11: "l9s-task2", 12: "", 13: ""} {
		if got := containerOfPid(proc, "l9s", pid); got != want {
			t.Errorf("pid %d: %q, want %q", pid, got, want)
		}
	}
}

// TestSeccompLogAttribution feeds records for a tracked container and an
// unknown process through handle and checks events, counts and metric.
func TestSeccompLogAttribution(t *testing.T) {
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "77"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "77", "cgroup"), []byte("0::/l9s/l9s-t9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var events []SeccompEvent
	r, err := NewSeccompLogReader(SeccompLogConfig{ProcRoot: proc, Registerer: reg, OnEvent: func(e SeccompEvent) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	r.Track("l9s-t9", "task-9")
	r.handle(SeccompEvent{Pid: 77, Syscall: 248})
	r.handle(SeccompEvent{Pid: 78, Syscall: 101})
	if len(events) != 2 || events[0].TaskID != "task-9" || events[0].ContainerID != "l9s-t9" || events[1].ContainerID != "" {
		t.Errorf("events %+v", events)
	}
	if r.Count("l9s-t9") != 1 {
		t.Errorf("count %d", r.Count("l9s-t9"))
	}
	if got := testutil.ToFloat64(r.counter.WithLabelValues("true")); got != 1 {
		t.Errorf("attributed metric %v", got)
	}
	if got := testutil.ToFloat64(r.counter.WithLabelValues("false")); got != 1 {
		t.Errorf("unattributed metric %v", got)
	}
	if _, err := NewSeccompLogReader(SeccompLogConfig{Registerer: reg}); err == nil {
		t.Error("registering the metric twice succeeded")
	}
}

func TestSyscallName(t *testing.T) {
	for _, tc := range []struct {
		arch string
		nr   int
		want string
	}{
		{"c000003e", 248, "add_key"},
		{"C000003E", 101, "ptrace"},
		{"c00000b7", 217, "add_key"},
		{"40000003", 286, "syscall 286 (arch 40000003)"},
		{"c000003e", 9999, "syscall 9999 (arch c000003e)"},
	} {
		if got := SyscallName(tc.arch, tc.nr); got != tc.want {
			t.Errorf("SyscallName(%s, %d) = %q, want %q", tc.arch, tc.nr, got, tc.want)
		}
	}
}
