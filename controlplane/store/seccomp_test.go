package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/store"
)

// TestSeccompTotals: agents send cumulative totals, so storing a report
// again or an older one after a newer never lowers a count; the task sums
// its attempts; the pool report counts tasks, observed ones included, and
// sees only the workspace's tasks of that pool.
func TestSeccompTotals(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	ws, other := newWorkspace(t, st), newWorkspace(t, st)
	a := newTask(t, st, ws.ID, "observe", nil)
	b := newTask(t, st, ws.ID, "observe", nil)
	quiet := newTask(t, st, ws.ID, "observe", nil)
	elsewhere := newTask(t, st, ws.ID, "default", nil)
	foreign := newTask(t, st, other.ID, "observe", nil)
	record := func(id string, n int, c ...store.SeccompCount) {
		t.Helper()
		if err := st.RecordSeccomp(ctx, id, n, c); err != nil {
			t.Fatal(err)
		}
	}
	record(a.ID, 1, store.SeccompCount{Syscall: "add_key", Count: 3})
	record(a.ID, 1, store.SeccompCount{Syscall: "add_key", Count: 5}, store.SeccompCount{Syscall: "ptrace", Count: 1})
	record(a.ID, 1, store.SeccompCount{Syscall: "add_key", Count: 4}) // older, arrived late
	record(a.ID, 1, store.SeccompCount{Syscall: "add_key", Count: 5}, store.SeccompCount{Syscall: "ptrace", Count: 1})
	record(a.ID, 2, store.SeccompCount{Syscall: "add_key", Count: 2})
	record(b.ID, 1, store.SeccompCount{Syscall: "ptrace", Count: 9})
	record(quiet.ID, 1)
	record(elsewhere.ID, 1, store.SeccompCount{Syscall: "kexec_load", Count: 1})
	record(foreign.ID, 1, store.SeccompCount{Syscall: "bpf", Count: 1})

	got, err := st.TaskSeccomp(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := []store.SeccompCount{{Syscall: "add_key", Count: 7}, {Syscall: "ptrace", Count: 1}}; !slices.Equal(got, want) {
		t.Errorf("task totals %+v, want %+v", got, want)
	}
	if got, err := st.TaskSeccomp(ctx, quiet.ID); err != nil || len(got) != 0 {
		t.Errorf("quiet task: %+v %v", got, err)
	}

	rep, err := st.PoolSeccomp(ctx, ws.ID, "observe", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Observed != 3 || len(rep.Syscalls) != 2 {
		t.Fatalf("pool report %+v", rep)
	}
	pt, ak := rep.Syscalls[0], rep.Syscalls[1]
	if pt.Syscall != "ptrace" || pt.Count != 10 || pt.Tasks != 2 || len(pt.TaskIDs) != 2 {
		t.Errorf("ptrace row %+v", pt)
	}
	if ak.Syscall != "add_key" || ak.Count != 7 || ak.Tasks != 1 || !slices.Equal(ak.TaskIDs, []string{a.ID}) {
		t.Errorf("add_key row %+v", ak)
	}
	if rep, err := st.PoolSeccomp(ctx, ws.ID, "observe", time.Now().Add(time.Hour)); err != nil || rep.Observed != 0 || len(rep.Syscalls) != 0 {
		t.Errorf("report of a window with no task: %+v %v", rep, err)
	}
	if err := st.RecordSeccomp(ctx, "task_none", 1, nil); err == nil {
		t.Error("totals of an unknown task were stored")
	}
}
