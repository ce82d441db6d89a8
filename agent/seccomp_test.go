package agent

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/agent/taskrun"
	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/sandbox"
)

// fakeReader stands in for the kernel log reader.
type fakeReader struct {
	// mu guards the fields below.
	mu            sync.Mutex
	fail          error
	starts, stops int
}

func (r *fakeReader) Start(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts++
	return r.fail
}

func (r *fakeReader) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stops++
}

func seccompTask(id string, mode sandbox.SeccompMode, rt sandbox.RuntimeName) taskrun.Task {
	return taskrun.Task{ID: id, Attempt: 1, Pool: "observe", Security: sandbox.Security{Profile: sandbox.ProfileHardened, Seccomp: mode, Runtime: rt}}
}

func seccompOf(r *agentv1.AttemptRecord) map[string]uint64 {
	out := map[string]uint64{}
	for _, c := range r.GetSeccomp().GetSyscalls() {
		out[c.Syscall] = c.Count
	}
	return out
}

// TestSeccompWatch: the reader starts with the first log-mode attempt on
// runc (never for enforce or runsc), records of a watched attempt are
// counted by name and told to the observer, changed totals go out at the
// flush interval and once more at the end, and an unreadable kernel log
// leaves attempts unwatched.
func TestSeccompWatch(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	rd := &fakeReader{}
	var mu sync.Mutex
	var seen []string
	w := NewSeccompWatch(SeccompWatchConfig{Reader: rd, Clock: clk, Flush: time.Second,
		Observer: SeccompObserverFunc(func(pool, task, syscall string) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, pool+"/"+task+"/"+syscall)
		})})
	defer w.Stop()
	q := newReportQueue(ReportConfig{})
	if w.watch(seccompTask("t_enf", sandbox.SeccompEnforce, sandbox.RuntimeRunc), q) ||
		w.watch(seccompTask("t_gv", sandbox.SeccompLog, sandbox.RuntimeRunsc), q) || rd.starts != 0 {
		t.Fatalf("enforce or runsc attempts watched (reader started %d times)", rd.starts)
	}
	task := seccompTask("t_a", sandbox.SeccompLog, sandbox.RuntimeRunc)
	if !w.watch(task, q) || !w.watch(seccompTask("t_b", sandbox.SeccompLog, sandbox.RuntimeRunc), newReportQueue(ReportConfig{})) || rd.starts != 1 {
		t.Fatalf("log-mode attempts not watched, or the reader started %d times", rd.starts)
	}
	q.pushRunning(testUpdate(v1.AttemptState_ATTEMPT_STATE_RUNNING))
	for _, nr := range []int{248, 248, 101} {
		w.Handle(sandbox.SeccompEvent{TaskID: task.RunID(), Syscall: nr, Arch: "c000003e"})
	}
	w.Handle(sandbox.SeccompEvent{TaskID: "t_other.1", Syscall: 248, Arch: "c000003e"})
	w.Handle(sandbox.SeccompEvent{Syscall: 248, Arch: "c000003e"})
	mu.Lock()
	if want := []string{"observe/t_a/add_key", "observe/t_a/add_key", "observe/t_a/ptrace"}; !slices.Equal(seen, want) {
		t.Errorf("observer saw %q, want %q", seen, want)
	}
	mu.Unlock()

	// The flush loop sends the changed totals after RUNNING.
	clk.BlockUntil(nil, 1)
	clk.Advance(time.Second)
	testEventuallyFake(t, func() bool { _, recs := q.batch(); return len(recs) == 2 })
	_, recs := q.batch()
	if got := seccompOf(recs[1]); got["add_key"] != 2 || got["ptrace"] != 1 || len(got) != 2 {
		t.Fatalf("flushed totals %v", got)
	}
	q.ack(2)

	// At the end: the last totals go, before the terminal record.
	w.Handle(sandbox.SeccompEvent{TaskID: task.RunID(), Syscall: 101, Arch: "c000003e"})
	done := make(chan struct{})
	go func() { defer close(done); w.finish(task.RunID()) }()
	clk.BlockUntil(nil, 2)
	clk.Advance(seccompSettle)
	<-done
	q.pushTerminal(testUpdate(v1.AttemptState_ATTEMPT_STATE_SUCCEEDED))
	first, recs := q.batch()
	if first != 3 || len(recs) != 2 || recs[1].GetUpdate() == nil {
		t.Fatalf("end records from %d: %v", first, recs)
	}
	if got := seccompOf(recs[0]); got["add_key"] != 2 || got["ptrace"] != 2 {
		t.Errorf("final totals %v", got)
	}
	w.Handle(sandbox.SeccompEvent{TaskID: task.RunID(), Syscall: 101, Arch: "c000003e"}) // after the end: ignored

	w.Stop()
	w.Stop()
	if rd.stops == 0 {
		t.Error("Stop did not stop the reader")
	}
	if w.watch(task, q) {
		t.Error("a stopped watch watches")
	}

	// A node whose kernel log cannot be read runs log-mode tasks unwatched.
	bad := NewSeccompWatch(SeccompWatchConfig{Reader: &fakeReader{fail: errors.New("open /dev/kmsg: permission denied")}})
	if bad.watch(task, q) {
		t.Error("watched without a kernel log")
	}
	if bad.watch(seccompTask("t_c", sandbox.SeccompLog, sandbox.RuntimeRunc), q) {
		t.Error("watched without a kernel log, the second time")
	}
	bad.Stop()
	var none *SeccompWatch
	none.Stop()
	if none.watch(task, q) {
		t.Error("a nil watch watches")
	}
}

// testEventuallyFake polls a condition the flush goroutine makes true.
func testEventuallyFake(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSeccompRecordsNeverWaitBehindNothing(t *testing.T) {
	// Totals pushed before RUNNING wait for it; later ones replace earlier
	// unsent ones.
	q := newReportQueue(ReportConfig{})
	sc := func(n uint64) *agentv1.AttemptRecord {
		return &agentv1.AttemptRecord{Record: &agentv1.AttemptRecord_Seccomp{Seccomp: &v1.SeccompLogged{
			Syscalls: []*v1.SeccompSyscall{{Syscall: "add_key", Count: n}}}}}
	}
	q.pushSeccomp(sc(1))
	if _, recs := q.batch(); recs != nil {
		t.Fatalf("sent before RUNNING: %v", recs)
	}
	q.pushRunning(testUpdate(v1.AttemptState_ATTEMPT_STATE_RUNNING))
	q.pushLog(testLog("a"))
	q.pushSeccomp(sc(2))
	_, recs := q.batch()
	if len(recs) != 3 || recs[1].GetLog() == nil || seccompOf(recs[2])["add_key"] != 2 {
		t.Fatalf("batch %v", recs)
	}
}
