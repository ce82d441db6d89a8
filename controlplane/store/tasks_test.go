package store_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

// room is a machine of 1 CPU and 1 GiB.
var room = store.Capacity{CPUMillis: 1000, MemoryBytes: 1 << 30}

// taskBundle is a store with a workspace and an enrolled machine.
type taskBundle struct {
	ctx context.Context
	st  *store.Store
	ws  store.Workspace
	m   store.Machine
}

func setupTasks(t *testing.T) *taskBundle {
	t.Helper()
	st := newStore(t)
	ws := newWorkspace(t, st)
	return &taskBundle{ctx: context.Background(), st: st, ws: ws, m: newMachine(t, st, ws.ID, "default")}
}

// placement places a task of the bundle's workspace on machine, in a pool
// that is not shared.
func (b *taskBundle) placement(task, machine string, cpu, mem int64, gpus []string) store.Placement {
	return store.Placement{TaskID: task, WorkspaceID: b.ws.ID, MachineID: machine, Capacity: room, CPUMillis: cpu, MemoryBytes: mem, GPUDevices: gpus}
}

// place puts task id on the bundle's machine and fails the test if it is
// not placed.
func (b *taskBundle) place(t *testing.T, id string) store.Attempt {
	t.Helper()
	a, err := b.st.PlaceAttempt(b.ctx, b.placement(id, b.m.ID, 100, 1<<20, nil))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (b *taskBundle) task(t *testing.T, id string) (store.Task, []store.Attempt) {
	t.Helper()
	tk, atts, err := b.st.GetTask(b.ctx, b.ws.ID, id)
	if err != nil {
		t.Fatal(err)
	}
	return tk, atts
}

func TestInsertTaskIdempotency(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	other := newWorkspace(t, b.st)
	withKey := func(key string) func(*store.Task) { return func(tk *store.Task) { tk.IdempotencyKey = key } }

	first := newTask(t, b.st, b.ws.ID, "default", withKey("k1"))
	if first.State != store.TaskPending || first.Attempts != 0 || first.IdempotencyKey != "k1" {
		t.Fatalf("inserted task = %+v", first)
	}
	for _, tc := range []struct {
		name         string
		ws, key      string
		wantExisting bool
	}{
		{"same key, same workspace", b.ws.ID, "k1", true},
		{"same key, another workspace", other.ID, "k1", false},
		{"another key", b.ws.ID, "k2", false},
		{"no key", b.ws.ID, "", false},
		{"no key again", b.ws.ID, "", false},
	} {
		got, existing, err := b.st.InsertTask(b.ctx, store.Task{ID: ids.New("task"), WorkspaceID: tc.ws, Pool: "default", Spec: []byte(`{}`),
			IdempotencyKey: tc.key, CreatedAt: time.Now()})
		if err != nil || existing != tc.wantExisting || (got.ID == first.ID) != tc.wantExisting {
			t.Errorf("%s: InsertTask = %s existing=%v (%v); want existing=%v", tc.name, got.ID, existing, err, tc.wantExisting)
		}
	}
	if _, _, err := b.st.InsertTask(b.ctx, store.Task{ID: first.ID, WorkspaceID: b.ws.ID, Spec: []byte(`{}`), CreatedAt: time.Now()}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("a duplicate task ID: %v", err)
	}
}

func TestPlaceAttempt(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	tk := newTask(t, b.st, b.ws.ID, "default", nil)
	a := b.place(t, tk.ID)
	if a.Number != 1 || a.State != store.AttemptScheduled || a.MachineID != b.m.ID || a.CPUMillis != 100 {
		t.Errorf("attempt = %+v", a)
	}
	got, atts := b.task(t, tk.ID)
	if got.State != store.TaskScheduled || got.Attempts != 1 || len(atts) != 1 {
		t.Errorf("placed task = %+v with %d attempts", got, len(atts))
	}
	if used, err := b.st.ActiveByWorkspace(b.ctx, "default"); err != nil || used[b.ws.ID] != 1 {
		t.Errorf("ActiveByWorkspace = %v, %v", used, err)
	}
	pm, err := b.st.PoolMachines(b.ctx, "default")
	if err != nil || len(pm) != 1 || pm[0].ID != b.m.ID || pm[0].UsedCPU != 100 || pm[0].UsedMem != 1<<20 {
		t.Errorf("PoolMachines = %+v, %v", pm, err)
	}

	deleted := newMachine(t, b.st, b.ws.ID, "default")
	if _, err := b.st.DeleteMachine(b.ctx, b.ws.ID, deleted.ID); err != nil {
		t.Fatal(err)
	}
	cancelled := newTask(t, b.st, b.ws.ID, "default", nil)
	if _, err := b.st.RequestCancel(b.ctx, b.ws.ID, cancelled.ID); err != nil {
		t.Fatal(err)
	}
	gpu := newMachine(t, b.st, b.ws.ID, "gpu")
	gpuTask := newTask(t, b.st, b.ws.ID, "gpu", nil)
	if _, err := b.st.PlaceAttempt(b.ctx, b.placement(gpuTask.ID, gpu.ID, 100, 1, []string{"GPU-0"})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		task     string
		machine  string
		cpu, mem int64
		gpus     []string
	}{
		{"placed twice", tk.ID, b.m.ID, 100, 1, nil},
		{"more CPU than is left", newTask(t, b.st, b.ws.ID, "default", nil).ID, b.m.ID, 901, 1, nil},
		{"more memory than is left", newTask(t, b.st, b.ws.ID, "default", nil).ID, b.m.ID, 1, 1<<30 - 1<<20 + 1, nil},
		{"a GPU already held", newTask(t, b.st, b.ws.ID, "gpu", nil).ID, gpu.ID, 1, 1, []string{"GPU-1", "GPU-0"}},
		{"deleted machine", newTask(t, b.st, b.ws.ID, "default", nil).ID, deleted.ID, 1, 1, nil},
		{"cancelled task", cancelled.ID, b.m.ID, 1, 1, nil},
	} {
		if _, err := b.st.PlaceAttempt(b.ctx, b.placement(tc.task, tc.machine, tc.cpu, tc.mem, tc.gpus)); !errors.Is(err, store.ErrNotPlaced) {
			t.Errorf("%s: %v, want ErrNotPlaced", tc.name, err)
		}
	}
	// Exactly what is left fits.
	if _, err := b.st.PlaceAttempt(b.ctx, b.placement(newTask(t, b.st, b.ws.ID, "default", nil).ID, b.m.ID, 900, 1<<30-1<<20, nil)); err != nil {
		t.Errorf("placing into exactly the room left: %v", err)
	}
	if _, err := b.st.PlaceAttempt(b.ctx, b.placement(tk.ID, "m_nope", 1, 1, nil)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown machine: %v", err)
	}
}

// TestPlaceAttemptKeepsWorkspaces: a machine takes only its own
// workspace's tasks unless its pool is shared, whatever workspace the
// caller claims for the task.
func TestPlaceAttemptKeepsWorkspaces(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	other := newWorkspace(t, b.st)
	theirs := newMachine(t, b.st, other.ID, "default")
	mine := newTask(t, b.st, b.ws.ID, "default", nil)
	for _, tc := range []struct {
		name string
		p    store.Placement
	}{
		{"on another workspace's machine", b.placement(mine.ID, theirs.ID, 100, 1, nil)},
		{"claiming the machine's workspace for the task", store.Placement{TaskID: mine.ID, WorkspaceID: other.ID, MachineID: theirs.ID,
			Capacity: room, CPUMillis: 100, MemoryBytes: 1}},
		{"claiming the machine's workspace in a shared pool", store.Placement{TaskID: mine.ID, WorkspaceID: other.ID, MachineID: b.m.ID,
			Shared: true, Capacity: room, CPUMillis: 100, MemoryBytes: 1}},
	} {
		if _, err := b.st.PlaceAttempt(b.ctx, tc.p); !errors.Is(err, store.ErrNotPlaced) {
			t.Errorf("%s: %v, want ErrNotPlaced", tc.name, err)
		}
	}
	if _, atts := b.task(t, mine.ID); len(atts) != 0 {
		t.Fatalf("refused placements left attempts: %+v", atts)
	}
	shared := b.placement(mine.ID, theirs.ID, 100, 1, nil)
	shared.Shared = true
	if a, err := b.st.PlaceAttempt(b.ctx, shared); err != nil || a.MachineID != theirs.ID {
		t.Errorf("in a shared pool: %+v, %v", a, err)
	}
	pm, err := b.st.PoolMachines(b.ctx, "default")
	if err != nil || len(pm) != 2 {
		t.Fatalf("PoolMachines = %+v, %v", pm, err)
	}
	for _, m := range pm {
		if want := map[string]string{b.m.ID: b.ws.ID, theirs.ID: other.ID}[m.ID]; m.WorkspaceID != want {
			t.Errorf("machine %s of workspace %q, want %q", m.ID, m.WorkspaceID, want)
		}
	}
}

// TestPlaceAttemptConcurrently places from many goroutines at once, as
// replicas do: no task is placed twice and no machine is overbooked.
func TestPlaceAttemptConcurrently(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	machines := []store.Machine{b.m, newMachine(t, b.st, b.ws.ID, "default"), newMachine(t, b.st, b.ws.ID, "default")}
	const tasks = 12
	var ids []string
	for range tasks {
		ids = append(ids, newTask(t, b.st, b.ws.ID, "default", nil).ID)
	}
	// Each task asks for 300 mCPU: a machine of 1000 holds three.
	var placed atomic.Int32
	var wg sync.WaitGroup
	for _, id := range ids {
		for _, m := range machines {
			wg.Go(func() {
				_, err := b.st.PlaceAttempt(b.ctx, b.placement(id, m.ID, 300, 1<<20, nil))
				switch {
				case err == nil:
					placed.Add(1)
				case !errors.Is(err, store.ErrNotPlaced):
					t.Errorf("place %s on %s: %v", id, m.ID, err)
				}
			})
		}
	}
	wg.Wait()
	if placed.Load() != 9 {
		t.Errorf("%d placements, want 9 (three machines of three)", placed.Load())
	}
	pm, err := b.st.PoolMachines(b.ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range pm {
		if m.UsedCPU != 900 {
			t.Errorf("machine %s holds %d mCPU, want 900", m.ID, m.UsedCPU)
		}
	}
	for _, id := range ids {
		if _, atts := b.task(t, id); len(atts) > 1 {
			t.Errorf("task %s placed %d times", id, len(atts))
		}
	}
	active, err := b.st.ActiveAttempts(b.ctx, "")
	if err != nil || len(active) != 9 {
		t.Errorf("ActiveAttempts = %d, %v; want 9", len(active), err)
	}
}

// TestPlaceAttemptWaitsForTheMachineLock: a placement waits while another
// transaction holds its machine, then counts what that one committed there.
// (A placement that read the machine's attempts before it held the lock
// would overbook it here.)
func TestPlaceAttemptWaitsForTheMachineLock(t *testing.T) {
	t.Parallel()
	st, url := env.NewStore(t)
	ws := newWorkspace(t, st)
	m := newMachine(t, st, ws.ID, "default")
	b := &taskBundle{ctx: context.Background(), st: st, ws: ws, m: m}
	held, waiting := newTask(t, st, ws.ID, "default", nil), newTask(t, st, ws.ID, "default", nil)
	conn, err := pgx.Connect(b.ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	tx, err := conn.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // a no-op after commit
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM machines WHERE id = $1 FOR UPDATE`, m.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(b.ctx, `INSERT INTO task_attempts (task_id, number, machine_id, state, cpu_millis, memory_bytes, gpu_devices)
		VALUES ($1, 1, $2, 'SCHEDULED', 900, 1048576, '{}')`, held.ID, m.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := st.PlaceAttempt(b.ctx, b.placement(waiting.ID, m.ID, 300, 1<<20, nil))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("placed while another transaction held the machine: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, store.ErrNotPlaced) {
			t.Fatalf("placing 300 mCPU beside a committed 900 of 1000: %v, want ErrNotPlaced", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("placement still waiting after the lock was released")
	}
	if tk, atts := b.task(t, waiting.ID); tk.State != store.TaskPending || len(atts) != 0 {
		t.Errorf("task %s is %s with %d attempts, want PENDING with none", waiting.ID, tk.State, len(atts))
	}
}

func TestAttemptLifecycle(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	exit := func(n int) *int { return &n }
	at := time.Now().UTC().Truncate(time.Microsecond)

	t.Run("run and succeed", func(t *testing.T) {
		tk := newTask(t, b.st, b.ws.ID, "default", nil)
		a := b.place(t, tk.ID)
		for _, tc := range []struct {
			n    int
			want bool
		}{{a.Number + 1, false}, {a.Number, true}, {a.Number, false}} {
			if changed, err := b.st.MarkRunning(b.ctx, tk.ID, tc.n, at, nil); err != nil || changed != tc.want {
				t.Errorf("MarkRunning(attempt %d) = %v, %v; want %v", tc.n, changed, err, tc.want)
			}
		}
		got, atts := b.task(t, tk.ID)
		if got.State != store.TaskRunning || atts[0].State != store.AttemptRunning || !atts[0].StartedAt.Equal(at) {
			t.Errorf("running task %+v, attempt %+v", got, atts[0])
		}
		if owner, wanted, err := b.st.AttemptOwner(b.ctx, b.m.ID, tk.ID, a.Number); err != nil || owner != b.ws.ID || !wanted {
			t.Errorf("AttemptOwner = %q, %v, %v; want %q, wanted", owner, wanted, err, b.ws.ID)
		}
		if _, _, err := b.st.AttemptOwner(b.ctx, "m_other", tk.ID, a.Number); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("AttemptOwner from another machine: %v", err)
		}

		if _, err := b.st.FinishAttempt(b.ctx, tk.ID, a.Number, store.AttemptEnd{State: store.AttemptRunning, At: at}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("finishing as RUNNING: %v", err)
		}
		end := store.AttemptEnd{State: store.AttemptSucceeded, ExitCode: exit(0), Message: "done", DroppedLines: 3, ImageDigest: "sha256:x", At: at.Add(time.Second)}
		for i, want := range []bool{true, false} {
			if changed, err := b.st.FinishAttempt(b.ctx, tk.ID, a.Number, end); err != nil || changed != want {
				t.Errorf("FinishAttempt #%d = %v, %v; want %v", i+1, changed, err, want)
			}
		}
		got, atts = b.task(t, tk.ID)
		if got.State != store.TaskSucceeded || *got.ExitCode != 0 || got.FinishedAt == nil || got.Message != "done" {
			t.Errorf("finished task = %+v", got)
		}
		if atts[0].State != store.AttemptSucceeded || atts[0].DroppedLines != 3 || atts[0].ImageDigest != "sha256:x" {
			t.Errorf("finished attempt = %+v", atts[0])
		}
		if changed, err := b.st.MarkRunning(b.ctx, tk.ID, a.Number, at, nil); err != nil || changed {
			t.Errorf("MarkRunning after the end = %v, %v", changed, err)
		}
		if _, changed, err := b.st.LoseAttempt(b.ctx, tk.ID, a.Number, "late"); err != nil || changed {
			t.Errorf("LoseAttempt after the end = %v, %v", changed, err)
		}
	})
	t.Run("finish straight from scheduled", func(t *testing.T) {
		tk := newTask(t, b.st, b.ws.ID, "default", nil)
		a := b.place(t, tk.ID)
		if changed, err := b.st.FinishAttempt(b.ctx, tk.ID, a.Number, store.AttemptEnd{State: store.AttemptFailed, ExitCode: exit(2), At: at}); err != nil || !changed {
			t.Fatalf("FinishAttempt = %v, %v", changed, err)
		}
		got, atts := b.task(t, tk.ID)
		if got.State != store.TaskFailed || *got.ExitCode != 2 || atts[0].StartedAt == nil {
			t.Errorf("task %+v, attempt %+v", got, atts[0])
		}
	})
}

func TestLoseAttempt(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	for _, tc := range []struct {
		name    string
		retries int
		cancel  bool
		// want is the task's state after each loss, one attempt per loss.
		want []store.TaskState
	}{
		{"no retries", 0, false, []store.TaskState{store.TaskFailed}},
		{"one retry", 1, false, []store.TaskState{store.TaskPending, store.TaskFailed}},
		{"two retries", 2, false, []store.TaskState{store.TaskPending, store.TaskPending, store.TaskFailed}},
		{"cancel asked", 3, true, []store.TaskState{store.TaskCancelled}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := newTask(t, b.st, b.ws.ID, "default", func(tk *store.Task) { tk.Retries = tc.retries })
			for i, want := range tc.want {
				a := b.place(t, tk.ID)
				if a.Number != i+1 {
					t.Fatalf("attempt number %d, want %d", a.Number, i+1)
				}
				if tc.cancel {
					if _, err := b.st.RequestCancel(b.ctx, b.ws.ID, tk.ID); err != nil {
						t.Fatal(err)
					}
				}
				state, changed, err := b.st.LoseAttempt(b.ctx, tk.ID, a.Number, "machine gone")
				if err != nil || !changed || state != want {
					t.Fatalf("loss %d: LoseAttempt = %q changed=%v (%v), want %q", i+1, state, changed, err, want)
				}
				if _, changed, _ := b.st.LoseAttempt(b.ctx, tk.ID, a.Number, "again"); changed {
					t.Errorf("loss %d: losing the same attempt again changed it", i+1)
				}
			}
			got, atts := b.task(t, tk.ID)
			if len(atts) != len(tc.want) {
				t.Fatalf("%d attempts, want %d", len(atts), len(tc.want))
			}
			for _, a := range atts {
				if a.State != store.AttemptLost || a.Message != "machine gone" || a.FinishedAt == nil {
					t.Errorf("attempt %+v, want LOST", a)
				}
			}
			if got.FinishedAt == nil {
				t.Errorf("task %+v ended without finished_at", got)
			}
			if got.State == store.TaskFailed && !strings.Contains(got.Message, "no retries left") {
				t.Errorf("message %q does not say why it failed", got.Message)
			}
			// A lost attempt's late report changes nothing.
			if changed, err := b.st.FinishAttempt(b.ctx, tk.ID, len(atts), store.AttemptEnd{State: store.AttemptSucceeded, At: time.Now()}); err != nil || changed {
				t.Errorf("finishing a lost attempt = %v, %v", changed, err)
			}
		})
	}
}

func TestRequestCancel(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	other := newWorkspace(t, b.st)

	pending := newTask(t, b.st, b.ws.ID, "default", nil)
	got, err := b.st.RequestCancel(b.ctx, b.ws.ID, pending.ID)
	if err != nil || got.State != store.TaskCancelled || !got.CancelRequested || got.FinishedAt == nil {
		t.Errorf("cancel a pending task = %+v, %v", got, err)
	}

	placed := newTask(t, b.st, b.ws.ID, "default", nil)
	a := b.place(t, placed.ID)
	if wanted, err := b.st.AttemptWanted(b.ctx, b.m.ID, placed.ID, a.Number); err != nil || !wanted {
		t.Errorf("AttemptWanted before the cancel = %v, %v", wanted, err)
	}
	got, err = b.st.RequestCancel(b.ctx, b.ws.ID, placed.ID)
	if err != nil || got.State != store.TaskScheduled || !got.CancelRequested || got.FinishedAt != nil {
		t.Errorf("cancel a placed task = %+v, %v; want it SCHEDULED until its machine reports", got, err)
	}
	for _, tc := range []struct {
		machine, task string
		n             int
	}{{b.m.ID, placed.ID, a.Number}, {"m_other", placed.ID, a.Number}, {b.m.ID, placed.ID, a.Number + 1}} {
		if wanted, err := b.st.AttemptWanted(b.ctx, tc.machine, tc.task, tc.n); err != nil || wanted {
			t.Errorf("AttemptWanted(%s, %s/%d) = %v, %v; want false", tc.machine, tc.task, tc.n, wanted, err)
		}
	}
	active, err := b.st.ActiveAttempts(b.ctx, b.m.ID)
	if err != nil || len(active) != 1 || !active[0].CancelRequested {
		t.Errorf("ActiveAttempts = %+v, %v", active, err)
	}

	done := newTask(t, b.st, b.ws.ID, "default", nil)
	da := b.place(t, done.ID)
	if _, err := b.st.FinishAttempt(b.ctx, done.ID, da.Number, store.AttemptEnd{State: store.AttemptSucceeded, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.st.RequestCancel(b.ctx, b.ws.ID, done.ID); err != nil || got.State != store.TaskSucceeded || got.CancelRequested {
		t.Errorf("cancel a finished task = %+v, %v; want it unchanged", got, err)
	}
	if _, err := b.st.RequestCancel(b.ctx, other.ID, placed.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("cancel from another workspace: %v", err)
	}
}

func TestListTasksPaging(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	other := newWorkspace(t, b.st)
	newTask(t, b.st, other.ID, "default", nil)
	base := time.Now().UTC().Truncate(time.Microsecond)
	// Five tasks, two sharing a creation time so the ID breaks the tie;
	// newest first is e, d, c|b (by ID), a.
	var want []string
	for i, d := range []time.Duration{0, time.Second, time.Second, 2 * time.Second, 3 * time.Second} {
		tk := newTask(t, b.st, b.ws.ID, "default", func(tk *store.Task) {
			tk.ID = "task_" + string(rune('a'+i))
			tk.CreatedAt = base.Add(d)
		})
		want = append([]string{tk.ID}, want...)
	}
	want[2], want[3] = "task_c", "task_b"
	b.place(t, "task_d")

	var got []string
	var beforeAt time.Time
	beforeID := ""
	for page := 0; ; page++ {
		tasks, atts, err := b.st.ListTasks(b.ctx, b.ws.ID, nil, 2, beforeAt, beforeID)
		if err != nil {
			t.Fatal(err)
		}
		if len(tasks) == 0 {
			break
		}
		if page > 3 {
			t.Fatal("paging does not end")
		}
		for _, tk := range tasks {
			got = append(got, tk.ID)
			if n := len(atts[tk.ID]); (tk.ID == "task_d") != (n == 1) {
				t.Errorf("task %s listed with %d attempts", tk.ID, n)
			}
		}
		last := tasks[len(tasks)-1]
		beforeAt, beforeID = last.CreatedAt, last.ID
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("pages = %v, want %v", got, want)
	}

	for _, tc := range []struct {
		states []store.TaskState
		want   int
	}{{[]store.TaskState{store.TaskPending}, 4}, {[]store.TaskState{store.TaskScheduled}, 1}, {[]store.TaskState{store.TaskPending, store.TaskScheduled}, 5}, {[]store.TaskState{store.TaskFailed}, 0}} {
		tasks, _, err := b.st.ListTasks(b.ctx, b.ws.ID, tc.states, 100, time.Time{}, "")
		if err != nil || len(tasks) != tc.want {
			t.Errorf("ListTasks(%v) = %d tasks (%v), want %d", tc.states, len(tasks), err, tc.want)
		}
	}
	pending, err := b.st.PendingTasks(b.ctx, 100)
	if err != nil || len(pending) != 5 || pending[0].ID == "task_d" {
		t.Errorf("PendingTasks = %+v, %v; want the 4 pending here and the other workspace's, oldest first", pending, err)
	}
}

// A failed start that is the machine's fault uses a retry as a lost
// attempt does; other reasons end the task; a reason outside the set is
// refused.
func TestEndAttemptReasons(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	fail := func(r store.Reason) store.AttemptEnd {
		return store.AttemptEnd{State: store.AttemptFailed, Reason: r, Summary: "one sentence", Message: "the chain", At: time.Now()}
	}
	for _, tc := range []struct {
		name    string
		retries int
		reasons []store.Reason
		want    []store.TaskState
	}{
		{"start failed, retries left", 1, []store.Reason{store.ReasonStartFailed, store.ReasonNetworkFailed},
			[]store.TaskState{store.TaskPending, store.TaskFailed}},
		{"mount failed, no retries", 0, []store.Reason{store.ReasonMountFailed}, []store.TaskState{store.TaskFailed}},
		{"image not found fails at once", 2, []store.Reason{store.ReasonImageNotFound}, []store.TaskState{store.TaskFailed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := newTask(t, b.st, b.ws.ID, "default", func(tk *store.Task) { tk.Retries = tc.retries })
			for i, r := range tc.reasons {
				a := b.place(t, tk.ID)
				st, changed, err := b.st.EndAttempt(b.ctx, tk.ID, a.Number, fail(r))
				if err != nil || !changed || st != tc.want[i] {
					t.Fatalf("attempt %d (%s): EndAttempt = %s, %v, %v; want %s", a.Number, r, st, changed, err, tc.want[i])
				}
				got, atts := b.task(t, tk.ID)
				last := atts[len(atts)-1]
				if got.State != tc.want[i] || got.ExitCode != nil || last.State != store.AttemptFailed || last.Reason != r ||
					last.Summary != "one sentence" || last.Message != "the chain" || last.ExitCode != nil {
					t.Fatalf("task %+v, attempt %+v", got, last)
				}
			}
		})
	}
	tk := newTask(t, b.st, b.ws.ID, "default", nil)
	a := b.place(t, tk.ID)
	if _, _, err := b.st.EndAttempt(b.ctx, tk.ID, a.Number, fail("bogus")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("unknown reason: %v", err)
	}
}
