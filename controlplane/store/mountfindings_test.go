package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/store"
)

// TestMountFindings: a task keeps the findings it was stored with; the
// pool report counts the tasks with volumes and those with findings, lists
// findings newest task first, and sees only the workspace's tasks of that
// pool created in the window.
func TestMountFindings(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	ws, other := newWorkspace(t, st), newWorkspace(t, st)
	withVolume := func(f ...store.MountFinding) func(*store.Task) {
		return func(tk *store.Task) {
			tk.Spec = []byte(`{"volumes":[{"name":"data","path":"/data"}]}`)
			tk.MountFindings = f
		}
	}
	at := func(d time.Duration, mut func(*store.Task)) func(*store.Task) {
		return func(tk *store.Task) {
			mut(tk)
			tk.CreatedAt = time.Now().UTC().Truncate(time.Microsecond).Add(d)
		}
	}
	proc := store.MountFinding{Volume: "data", Path: "/proc", Reason: "over /proc"}
	etc := store.MountFinding{Volume: "ck", Path: "/etc/ck", Reason: "over /etc"}
	older := newTask(t, st, ws.ID, "observe", at(-time.Minute, withVolume(proc)))
	newer := newTask(t, st, ws.ID, "observe", at(0, withVolume(etc, proc)))
	newTask(t, st, ws.ID, "observe", withVolume())
	newTask(t, st, ws.ID, "observe", nil)
	newTask(t, st, ws.ID, "observe", at(-48*time.Hour, withVolume(proc)))
	newTask(t, st, ws.ID, "default", withVolume(proc))
	newTask(t, st, other.ID, "observe", withVolume(proc))

	got, _, err := st.GetTask(ctx, ws.ID, newer.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.MountFindings, []store.MountFinding{etc, proc}) {
		t.Fatalf("stored findings %+v", got.MountFindings)
	}
	if got, _, _ := st.GetTask(ctx, ws.ID, older.ID); len(got.MountFindings) != 1 {
		t.Fatalf("older task's findings %+v", got.MountFindings)
	}

	rep, err := st.PoolMountFindings(ctx, ws.ID, "observe", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if rep.WithVolumes != 3 || rep.WithFindings != 2 {
		t.Fatalf("counts: %d with volumes, %d with findings; want 3, 2", rep.WithVolumes, rep.WithFindings)
	}
	var ids []string
	for _, f := range rep.Findings {
		ids = append(ids, f.TaskID+" "+f.Path)
	}
	want := []string{newer.ID + " /etc/ck", newer.ID + " /proc", older.ID + " /proc"}
	if !slices.Equal(ids, want) {
		t.Fatalf("findings %v, want %v", ids, want)
	}
}
