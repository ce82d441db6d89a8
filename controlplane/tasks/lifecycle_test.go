package tasks_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/internal/ids"
)

// lifeBundle is a Service on a migrated database of its own, with one
// enrolled machine whose agent answers pushes through hang.
type lifeBundle struct {
	st      *store.Store
	rdb     *redis.Client
	svc     *tasks.Service
	ws      string
	machine string
	agents  *hangingAgents
	// pg is the database's connection string.
	pg string
}

func setupLife(t *testing.T) *lifeBundle {
	t.Helper()
	ctx := context.Background()
	cfg := config1s(t)
	st, rdb, ws := storeAndRedis(ctx, t, cfg, "life")
	m := store.Machine{ID: ids.New("m"), WorkspaceID: ws.ID, Name: "box", Pool: "default", CreatedAt: time.Now()}
	jt := store.JoinTokenRow{ID: ids.New("jt"), MachineID: m.ID, Hash: []byte("h"), ExpiresAt: time.Now().Add(time.Hour)}
	if err := st.CreateMachine(ctx, m, jt); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Enroll(ctx, jt.ID, time.Now(), func([]byte) bool { return true }, func(store.Machine) (store.Enrollment, error) {
		return store.Enrollment{Serial: "1", NotAfter: time.Now().Add(time.Hour)}, nil
	}); err != nil {
		t.Fatal(err)
	}
	inv, _ := protojson.Marshal(&v1.Inventory{Cpus: 4, MemoryBytes: 8 << 30})
	if _, err := st.Heartbeat(ctx, m.ID, "quic", "test", inv); err != nil {
		t.Fatal(err)
	}
	ag := &hangingAgents{machine: m.ID, pushed: make(chan string, 100)}
	svc, err := tasks.New(tasks.Config{Store: st, Redis: rdb, Config: cfg, Tick: 10 * time.Millisecond,
		Agents: func() tasks.Agents { return ag }})
	if err != nil {
		t.Fatal(err)
	}
	return &lifeBundle{st: st, rdb: rdb, svc: svc, ws: ws.ID, machine: m.ID, agents: ag, pg: cfg.Database.Postgres.ConnString()}
}

// startLife is setupLife with the Service started (stopped at cleanup).
func startLife(t *testing.T) (*lifeBundle, context.Context) {
	t.Helper()
	b := setupLife(t)
	ctx := context.Background()
	if err := b.svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.svc.Stop)
	return b, ctx
}

// lineRecord is an agent's record of one output line.
func lineRecord(at *timestamppb.Timestamp, text string) *agentv1.AttemptRecord {
	return &agentv1.AttemptRecord{Time: at, Record: &agentv1.AttemptRecord_Log{Log: &v1.LogLine{Text: text}}}
}

// placed submits a long task and returns its id once its attempt was
// pushed to the machine.
func (b *lifeBundle) placed(ctx context.Context, t *testing.T) string {
	t.Helper()
	task, _, err := b.svc.Submit(ctx, b.ws, &v1.TaskSpec{Command: []string{"sleep", "600"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(20 * time.Second)
	for {
		select {
		case m := <-b.agents.pushed:
			if m == agentv1.Agent_RunTask_FullMethodName {
				return task.Id
			}
		case <-deadline:
			t.Fatal("the placed attempt was never pushed")
		}
	}
}

// hangingAgents has one machine online whose pushes block until their
// context ends.
type hangingAgents struct {
	machine string
	pushed  chan string
}

func (h *hangingAgents) Conn(context.Context, string) (grpc.ClientConnInterface, error) {
	return h, nil
}
func (h *hangingAgents) Online(id string) (string, bool) { return "quic", id == h.machine }

func (h *hangingAgents) Invoke(ctx context.Context, method string, _, _ any, _ ...grpc.CallOption) error {
	h.pushed <- method
	<-ctx.Done()
	return ctx.Err()
}

func (h *hangingAgents) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("no streams")
}

// Start and Stop, over and over, with work in flight: Stop waits for every
// goroutine (pushes included), is safe twice, concurrently and before
// Start, a second Start is refused, and nothing leaks.
func TestServiceStartStopStress(t *testing.T) {
	b := setupLife(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	b.svc.Stop() // before Start
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		if err := b.svc.Start(ctx); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		cancel() // the caller's context does not stop it
		if err := b.svc.Start(context.Background()); err == nil {
			t.Fatalf("round %d: a second Start was accepted", i)
		}
		if i%4 == 0 {
			if _, _, err := b.svc.Submit(context.Background(), b.ws, &v1.TaskSpec{Command: []string{"true"}}, ""); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(b.svc.Stop)
		}
		wg.Wait()
		b.svc.Stop()
	}
	b.rdb.Close()
	b.st.Close()
}

// A push in flight at Stop is cut without giving up its attempt: the task
// stays SCHEDULED for its agent's next heartbeat to settle.
func TestStopCutsPushesWithoutLosingAttempts(t *testing.T) {
	b := setupLife(t)
	if err := b.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	task, _, err := b.svc.Submit(context.Background(), b.ws, &v1.TaskSpec{Command: []string{"true"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-b.agents.pushed:
		if m != agentv1.Agent_RunTask_FullMethodName {
			t.Fatalf("pushed %s", m)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the placed attempt was never pushed")
	}
	stopped := make(chan struct{})
	go func() { b.svc.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not cut the hanging push")
	}
	got, err := b.svc.Get(context.Background(), b.ws, task.Id)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != v1.TaskState_TASK_STATE_SCHEDULED || len(got.Attempts) != 1 || got.Attempts[0].State != v1.AttemptState_ATTEMPT_STATE_SCHEDULED {
		t.Fatalf("after Stop: task %v, attempts %v", got.State, got.Attempts)
	}
}

// storeAndRedis opens and migrates the test store of cfg, a Redis client
// on its Redis, and makes a workspace called name.
func storeAndRedis(ctx context.Context, t *testing.T, cfg *config.Config, name string) (*store.Store, *redis.Client, store.Workspace) {
	t.Helper()
	st, err := store.Open(ctx, cfg.Database.Postgres.ConnString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Database.Redis.Addr, Password: cfg.Database.Redis.Password, DB: cfg.Database.Redis.DB})
	t.Cleanup(func() { rdb.Close() })
	ws := store.Workspace{ID: ids.New("ws"), Name: name, CreatedAt: time.Now()}
	if err := st.CreateWorkspace(ctx, ws); err != nil {
		t.Fatal(err)
	}
	return st, rdb, ws
}

// TestReportSaysStopWhenNoLongerWanted: a report's Stop answer follows a
// cancel made on this replica at once, and one made elsewhere (straight in
// the store, as another replica would) within a second or so, although the
// replica no longer asks Postgres on every report of a placed attempt. A
// report from a machine that does not run the attempt is told to stop.
func TestReportSaysStopWhenNoLongerWanted(t *testing.T) {
	b, ctx := startLife(t)
	placed := func() string { return b.placed(ctx, t) }
	stop := func(machine, id string) bool {
		t.Helper()
		resp, err := b.svc.Report(ctx, machine, &agentv1.ReportAttemptRequest{TaskId: id, Attempt: 1})
		if err != nil {
			t.Fatalf("report %s: %v", id, err)
		}
		return resp.Stop
	}

	here := placed()
	if stop(b.machine, here) {
		t.Fatal("a running attempt was told to stop")
	}
	if !stop("m_other", here) {
		t.Error("a machine that does not run the attempt was not told to stop")
	}
	if _, err := b.svc.Cancel(ctx, b.ws, here); err != nil {
		t.Fatal(err)
	}
	if !stop(b.machine, here) {
		t.Error("the report after a cancel on this replica did not say stop")
	}

	elsewhere := placed()
	if stop(b.machine, elsewhere) {
		t.Fatal("a running attempt was told to stop")
	}
	if _, err := b.st.RequestCancel(ctx, b.ws, elsewhere); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for !stop(b.machine, elsewhere) {
		if time.Now().After(deadline) {
			t.Fatal("a cancel made on another replica never reached a report's answer")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRunningStreamsBeforeItsRow: a report of RUNNING and the first lines
// puts them on the task's stream without waiting for Postgres, but is not
// acknowledged until Postgres has RUNNING too. Here Postgres refuses the
// write (a trigger): the lines are followed all the same, the report
// fails, and its resend writes the row and streams no record twice.
func TestRunningStreamsBeforeItsRow(t *testing.T) {
	b, ctx := startLife(t)
	id := b.placed(ctx, t)
	conn, err := pgx.Connect(ctx, b.pg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	refuse := func(on bool) {
		t.Helper()
		sql := `DROP TRIGGER IF EXISTS refuse_running ON task_attempts`
		if on {
			sql = `CREATE OR REPLACE FUNCTION refuse_running() RETURNS trigger LANGUAGE plpgsql AS
				$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
				CREATE TRIGGER refuse_running BEFORE UPDATE ON task_attempts FOR EACH ROW
				WHEN (NEW.state = 'RUNNING') EXECUTE FUNCTION refuse_running()`
		}
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	now := timestamppb.Now()
	req := &agentv1.ReportAttemptRequest{TaskId: id, Attempt: 1, FirstSeq: 1, Records: []*agentv1.AttemptRecord{
		{Time: now, Record: &agentv1.AttemptRecord_Update{Update: &agentv1.AttemptUpdate{State: v1.AttemptState_ATTEMPT_STATE_RUNNING}}},
		lineRecord(now, "one"), lineRecord(now, "two")}}

	refuse(true)
	if _, err := b.svc.Report(ctx, b.machine, req); err == nil {
		t.Fatal("a report whose RUNNING write failed was acknowledged")
	}
	if got, _, _ := b.st.GetTask(ctx, b.ws, id); got.State == store.TaskRunning {
		t.Fatal("the row is RUNNING although Postgres refused the write")
	}
	if got := followed(ctx, t, b.svc, b.ws, id); got != "RUNNING one two" {
		t.Fatalf("the stream before the row has %q, want RUNNING one two", got)
	}

	refuse(false)
	resp, err := b.svc.Report(ctx, b.machine, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.AckedSeq != 3 {
		t.Errorf("acknowledged %d, want 3", resp.AckedSeq)
	}
	if got, _, err := b.st.GetTask(ctx, b.ws, id); err != nil || got.State != store.TaskRunning {
		t.Errorf("task state after the resend %q (%v), want RUNNING", got.State, err)
	}
	if got := followed(ctx, t, b.svc, b.ws, id); got != "RUNNING one two" {
		t.Errorf("the stream after the resend has %q, want each record once", got)
	}
}

// followed is what a follower sees of a task's attempt records so far:
// RUNNING for that state change, a line's text for a line.
func followed(ctx context.Context, t *testing.T, svc *tasks.Service, ws, id string) string {
	t.Helper()
	var got []string
	err := svc.Follow(ctx, ws, id, "", true, func(ev *v1.TaskEvent) error {
		switch {
		case ev.GetLog() != nil:
			got = append(got, ev.GetLog().GetText())
		case ev.GetState().GetAttemptState() == v1.AttemptState_ATTEMPT_STATE_RUNNING:
			got = append(got, "RUNNING")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(got, " ")
}

// TestFollowerStreamsWhilePostgresStalls: a follower of a live stream reads
// the task's row only when the stream has been quiet (at first, and after
// a quiet spell), not after each batch of lines, so lines keep reaching it
// while Postgres stalls (here the tasks table is locked) — and a
// follower no longer costs a Postgres read per batch.
func TestFollowerStreamsWhilePostgresStalls(t *testing.T) {
	b, ctx := startLife(t)
	id := b.placed(ctx, t)
	now := timestamppb.Now()
	seq := uint64(1)
	report := func(recs ...*agentv1.AttemptRecord) {
		t.Helper()
		resp, err := b.svc.Report(ctx, b.machine, &agentv1.ReportAttemptRequest{TaskId: id, Attempt: 1, FirstSeq: seq, Records: recs})
		if err != nil || resp.AckedSeq != seq+uint64(len(recs))-1 {
			t.Fatalf("report from %d: %v %v", seq, resp, err)
		}
		seq += uint64(len(recs))
	}
	report(&agentv1.AttemptRecord{Time: now, Record: &agentv1.AttemptRecord_Update{Update: &agentv1.AttemptUpdate{State: v1.AttemptState_ATTEMPT_STATE_RUNNING}}})

	fctx, cancel := context.WithCancel(ctx)
	lines := make(chan string, 16)
	followed := make(chan error, 1)
	go func() {
		followed <- b.svc.Follow(fctx, b.ws, id, "", false, func(ev *v1.TaskEvent) error {
			switch {
			case ev.GetLog() != nil:
				lines <- ev.GetLog().GetText()
			case ev.GetState().GetAttemptState() == v1.AttemptState_ATTEMPT_STATE_RUNNING:
				lines <- "RUNNING"
			}
			return nil
		})
	}()
	defer func() {
		cancel()
		if err := <-followed; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("follow: %v", err)
		}
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-lines:
			if got != want {
				t.Fatalf("follower got %q, want %q", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("follower did not get %q within 5s", want)
		}
	}
	expect("RUNNING")
	// Let the follower settle on its quiet wait (its row read done).
	time.Sleep(100 * time.Millisecond)

	conn, err := pgx.Connect(ctx, b.pg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, batch := range [][]string{{"one", "two"}, {"three"}, {"four", "five"}} {
		var recs []*agentv1.AttemptRecord
		for _, s := range batch {
			recs = append(recs, lineRecord(now, s))
		}
		report(recs...)
		for _, s := range batch {
			expect(s)
		}
	}
}
