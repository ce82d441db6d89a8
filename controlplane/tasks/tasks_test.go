package tasks_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/ids"
)

var env *controlplanetest.Env

func TestMain(m *testing.M) { os.Exit(controlplanetest.Main(m, &env)) }

type bundle struct {
	in    *controlplanetest.Instance
	ctx   context.Context
	tasks v1.TaskServiceClient
}

func config1s(t *testing.T) *config.Config {
	cfg := env.Config(t)
	cfg.Controlplane.LostAgentGrace = "1s"
	cfg.Worker.DefaultImage = "busybox:test"
	controlplanetest.StandInAgent(t, cfg)
	return cfg
}

func start(t *testing.T, cfg *config.Config) *bundle {
	t.Helper()
	in := controlplanetest.Start(t, cfg, true)
	resp, err := v1.NewAuthServiceClient(in.Conn).Authorize(metadata.AppendToOutgoingContext(context.Background(), "x-levers9-bootstrap-secret", "test-bootstrap-secret-0123456789abcdef"), &v1.AuthorizeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	controlplanetest.WaitTunnelEndpoint(t, in)
	return &bundle{in: in, ctx: metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+resp.Token), tasks: v1.NewTaskServiceClient(in.Conn)}
}

func (b *bundle) submit(t *testing.T, spec *v1.TaskSpec, key string) *v1.Task {
	t.Helper()
	resp, err := b.tasks.SubmitTask(b.ctx, &v1.SubmitTaskRequest{Spec: spec, IdempotencyKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Task
}

// follow collects a task's events from cursor until the stream ends.
func follow(t *testing.T, b *bundle, id, cursor string, limit int) []*v1.TaskEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	st, err := b.tasks.FollowTask(ctx, &v1.FollowTaskRequest{Id: id, Cursor: cursor})
	if err != nil {
		t.Fatal(err)
	}
	var out []*v1.TaskEvent
	for limit <= 0 || len(out) < limit {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("follow %s: %v", id, err)
		}
		out = append(out, ev)
	}
	return out
}

func describe(evs []*v1.TaskEvent) string {
	var parts []string
	for _, e := range evs {
		switch {
		case e.GetLog() != nil:
			parts = append(parts, fmt.Sprintf("%d:%s", e.Attempt, e.GetLog().Text))
		case e.GetState() != nil:
			s := e.GetState()
			p := fmt.Sprintf("%d:%s", e.Attempt, strings.TrimPrefix(s.TaskState.String(), "TASK_STATE_"))
			if s.NewAttempt {
				p += "(new)"
			}
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, " ")
}

func waitState(t *testing.T, b *bundle, id string, want v1.TaskState) *v1.Task {
	t.Helper()
	var got *v1.Task
	controlplanetest.Eventually(t, 20*time.Second, "task "+id+" in "+want.String(), func() bool {
		r, err := b.tasks.GetTask(b.ctx, &v1.GetTaskRequest{Id: id})
		if err != nil {
			return false
		}
		got = r.Task
		return got.State == want
	})
	return got
}

func TestTaskRunsAndIsFollowed(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 4, 0)
	task := b.submit(t, &v1.TaskSpec{Command: []string{"echo", "one", "two", "three"}}, "")
	if task.Spec.Image != "busybox:test" || task.Spec.CpuMillis != 500 || task.Spec.Pool != "default" {
		t.Errorf("defaults not applied: %v", task.Spec)
	}
	evs := follow(t, b, task.Id, "", 0)
	if got, want := describe(evs), "0:PENDING 1:SCHEDULED 1:RUNNING 1:one 1:two 1:three 1:SUCCEEDED"; got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	// Resuming from the third event's cursor gives exactly the rest.
	rest := follow(t, b, task.Id, evs[2].Cursor, 0)
	if got, want := describe(rest), "1:one 1:two 1:three 1:SUCCEEDED"; got != want {
		t.Errorf("resumed events\n got %s\nwant %s", got, want)
	}
	done := waitState(t, b, task.Id, v1.TaskState_TASK_STATE_SUCCEEDED)
	if len(done.Attempts) != 1 || done.Attempts[0].State != v1.AttemptState_ATTEMPT_STATE_SUCCEEDED || done.Attempts[0].StartedAt == nil {
		t.Errorf("attempts: %v", done.Attempts)
	}
	failed := b.submit(t, &v1.TaskSpec{Command: []string{"exit", "3"}}, "")
	evs = follow(t, b, failed.Id, "", 0)
	last := evs[len(evs)-1].GetState()
	if last.TaskState != v1.TaskState_TASK_STATE_FAILED || last.GetExitCode() != 3 {
		t.Errorf("final event %v", last)
	}
	if _, err := b.tasks.FollowTask(b.ctx, &v1.FollowTaskRequest{Id: task.Id, Cursor: "garbage"}); err == nil {
		// The error arrives with the first Recv on a server stream.
		st, _ := b.tasks.FollowTask(b.ctx, &v1.FollowTaskRequest{Id: task.Id, Cursor: "garbage"})
		if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("bad cursor: %v", err)
		}
	}
}

func TestSubmitRefusals(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	controlplanetest.Eventually(t, 10*time.Second, "machine online with its inventory", func() bool {
		r, err := v1.NewMachineServiceClient(b.in.Conn).ListMachines(b.ctx, &v1.ListMachinesRequest{})
		return err == nil && len(r.Machines) == 1 && r.Machines[0].GetInventory().GetCpus() == 2
	})
	for _, tc := range []struct {
		name string
		spec *v1.TaskSpec
		key  string
		code codes.Code
		msg  string
	}{
		{"gpu on a pool without", &v1.TaskSpec{Gpus: 1}, "", codes.FailedPrecondition, `pool "default" has no GPUs`},
		{"unknown pool", &v1.TaskSpec{Pool: "nope"}, "", codes.InvalidArgument, `pool "nope" is not declared`},
		{"bad env", &v1.TaskSpec{Env: map[string]string{"1BAD": "x"}}, "", codes.InvalidArgument, `env "1BAD"`},
		{"negative cpu", &v1.TaskSpec{CpuMillis: -1}, "", codes.InvalidArgument, "cpu_millis"},
		{"too big", &v1.TaskSpec{CpuMillis: 64000}, "", codes.FailedPrecondition, "no machine has CPU and memory"},
		{"looser security", &v1.TaskSpec{Env: map[string]string{"LEVERS9_SECCOMP": "off"}}, "", codes.PermissionDenied, "looser than the pool's"},
		{"bad key", &v1.TaskSpec{}, "has space", codes.InvalidArgument, "idempotency_key"},
	} {
		_, err := b.tasks.SubmitTask(b.ctx, &v1.SubmitTaskRequest{Spec: tc.spec, IdempotencyKey: tc.key})
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: got %v, want %s with %q", tc.name, err, tc.code, tc.msg)
		}
	}
	r, err := b.tasks.ListTasks(b.ctx, &v1.ListTasksRequest{})
	if err != nil || len(r.Tasks) != 0 {
		t.Errorf("refused submits stored tasks: %v %v", r, err)
	}
	// A stricter setting is accepted.
	ok := b.submit(t, &v1.TaskSpec{Env: map[string]string{"LEVERS9_SECCOMP": "enforce"}, Command: []string{"echo", "x"}}, "")
	r, err = b.tasks.ListTasks(b.ctx, &v1.ListTasksRequest{})
	if err != nil || len(r.Tasks) != 1 || r.Tasks[0].Id != ok.Id {
		t.Errorf("list after one accepted submit: %v %v", r, err)
	}
}

func TestIdempotencyKeyRunsOnce(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	a := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	spec := &v1.TaskSpec{Command: []string{"echo", "once"}}
	var wg sync.WaitGroup
	ids := make([]string, 8)
	existing := make([]bool, 8)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := b.tasks.SubmitTask(b.ctx, &v1.SubmitTaskRequest{Spec: spec, IdempotencyKey: "k-1"})
			if err != nil {
				t.Error(err)
				return
			}
			ids[i], existing[i] = resp.Task.Id, resp.Existing
		}()
	}
	wg.Wait()
	fresh := 0
	for i := range ids {
		if ids[i] != ids[0] {
			t.Fatalf("one key gave tasks %v", ids)
		}
		if !existing[i] {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d submits claim to have created the task", fresh)
	}
	waitState(t, b, ids[0], v1.TaskState_TASK_STATE_SUCCEEDED)
	// A second start would come from a later scheduling pass (one a tick).
	holds(t, 1500*time.Millisecond, "the agent started the task once", func() bool { return len(a.Started()) == 1 })
}

// holds checks cond for the whole of d, failing the test the first time
// it is false: for what must not happen, where waiting is the test.
func holds(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.NewTimer(d)
	defer end.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if !cond() {
			t.Fatalf("no longer true: %s", what)
		}
		select {
		case <-end.C:
			return
		case <-tick.C:
		}
	}
}

func TestCapacityIsRespectedAndReusedAtOnce(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	a := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 1, 0)
	var ids []string
	begin := time.Now()
	for i := 0; i < 5; i++ {
		ids = append(ids, b.submit(t, &v1.TaskSpec{Command: []string{"sleep", "200ms"}, CpuMillis: 1000}, "").Id)
	}
	for _, id := range ids {
		waitState(t, b, id, v1.TaskState_TASK_STATE_SUCCEEDED)
	}
	if p := a.PeakRunning(); p != 1 {
		t.Errorf("a 1-CPU machine ran %d 1-CPU tasks at once", p)
	}
	// Five 200 ms tasks one after another: freed capacity is reused when a
	// task ends, not at the next 1 s tick (which would take 5 s or more).
	if d := time.Since(begin); d > 4*time.Second {
		t.Errorf("5 sequential 200 ms tasks took %s", d)
	}
}

func TestFairAcrossWorkspaces(t *testing.T) {
	t.Parallel()
	// One machine serving two workspaces: the operator shares the pool.
	cfg := config1s(t)
	cfg.Worker.Pools["default"] = config.Pool{Runtime: "runc", Shared: true}
	b := start(t, cfg)
	other := secondWorkspace(t, b)
	for i := 0; i < 6; i++ {
		b.submit(t, &v1.TaskSpec{Command: []string{"sleep", "150ms"}, CpuMillis: 1000}, "")
	}
	var theirs []string
	for i := 0; i < 2; i++ {
		theirs = append(theirs, other.submit(t, &v1.TaskSpec{Command: []string{"sleep", "150ms"}, CpuMillis: 1000}, "").Id)
	}
	a := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 1, 0)
	for _, id := range theirs {
		waitState(t, other, id, v1.TaskState_TASK_STATE_SUCCEEDED)
	}
	order := a.Started()
	pos := map[string]int{}
	for i, k := range order {
		pos[strings.Split(k, "/")[0]] = i
	}
	// Alternating: the other workspace's two tasks are among the first four.
	for _, id := range theirs {
		if pos[id] > 3 {
			t.Errorf("the second workspace's task started %d-th: %v", pos[id]+1, order)
		}
	}
}

func TestCancelPendingAndRunning(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	pending := b.submit(t, &v1.TaskSpec{Command: []string{"sleep"}}, "")
	c, err := b.tasks.CancelTask(b.ctx, &v1.CancelTaskRequest{Id: pending.Id})
	if err != nil || c.Task.State != v1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("cancel pending: %v %v", c, err)
	}
	if got := describe(follow(t, b, pending.Id, "", 0)); got != "0:PENDING 0:CANCELLED" {
		t.Errorf("events of a cancelled pending task: %s", got)
	}
	controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	running := b.submit(t, &v1.TaskSpec{Command: []string{"sleep"}}, "")
	waitState(t, b, running.Id, v1.TaskState_TASK_STATE_RUNNING)
	// No-wait follows return what is stored while the task runs.
	begin := time.Now()
	st, err := b.tasks.FollowTask(b.ctx, &v1.FollowTaskRequest{Id: running.Id, NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	var soFar []*v1.TaskEvent
	for {
		ev, err := st.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		soFar = append(soFar, ev)
	}
	if got := describe(soFar); got != "0:PENDING 1:SCHEDULED 1:RUNNING" || time.Since(begin) > 5*time.Second {
		t.Errorf("no-wait follow of a running task: %s after %s", got, time.Since(begin))
	}
	if _, err := b.tasks.CancelTask(b.ctx, &v1.CancelTaskRequest{Id: running.Id}); err != nil {
		t.Fatal(err)
	}
	done := waitState(t, b, running.Id, v1.TaskState_TASK_STATE_CANCELLED)
	if done.Attempts[0].State != v1.AttemptState_ATTEMPT_STATE_CANCELLED {
		t.Errorf("attempt %v", done.Attempts[0])
	}
	// Cancelling a finished task changes nothing.
	again, err := b.tasks.CancelTask(b.ctx, &v1.CancelTaskRequest{Id: running.Id})
	if err != nil || again.Task.State != v1.TaskState_TASK_STATE_CANCELLED {
		t.Errorf("second cancel: %v %v", again, err)
	}
}

func TestLostAgentRetriesElsewhere(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	first := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	// Long enough that the attempt cannot end on the first machine before
	// it stops, however slow a loaded run is (500 ms once was not).
	task := b.submit(t, &v1.TaskSpec{Command: []string{"sleep", "3s"}, Retries: 1}, "")
	waitState(t, b, task.Id, v1.TaskState_TASK_STATE_RUNNING)
	first.Stop() // its tunnel is gone; after the 1 s grace the attempt is lost
	second := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	done := waitState(t, b, task.Id, v1.TaskState_TASK_STATE_SUCCEEDED)
	if len(done.Attempts) != 2 || done.Attempts[0].State != v1.AttemptState_ATTEMPT_STATE_LOST ||
		done.Attempts[0].MachineId != first.ID || done.Attempts[1].MachineId != second.ID {
		t.Fatalf("attempts: %v", done.Attempts)
	}
	got := describe(follow(t, b, task.Id, "", 0))
	if want := "0:PENDING 1:SCHEDULED 1:RUNNING 1:PENDING 2:SCHEDULED(new) 2:RUNNING 2:SUCCEEDED"; got != want {
		t.Errorf("events\n got %s\nwant %s", got, want)
	}
	// Without retries a lost attempt fails the task, saying why.
	lone := b.submit(t, &v1.TaskSpec{Command: []string{"sleep"}}, "")
	waitState(t, b, lone.Id, v1.TaskState_TASK_STATE_RUNNING)
	second.Stop()
	failed := waitState(t, b, lone.Id, v1.TaskState_TASK_STATE_FAILED)
	if !strings.Contains(failed.Message, "no retries left") {
		t.Errorf("message %q", failed.Message)
	}
}

func TestMachineDeletedLosesItsAttempts(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	a := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	task := b.submit(t, &v1.TaskSpec{Command: []string{"sleep"}}, "")
	waitState(t, b, task.Id, v1.TaskState_TASK_STATE_RUNNING)
	if _, err := v1.NewMachineServiceClient(b.in.Conn).DeleteMachine(b.ctx, &v1.DeleteMachineRequest{Id: a.ID}); err != nil {
		t.Fatal(err)
	}
	done := waitState(t, b, task.Id, v1.TaskState_TASK_STATE_FAILED)
	if !strings.Contains(done.Attempts[0].Message, "deleted") && !strings.Contains(done.Attempts[0].Message, "offline") {
		t.Errorf("attempt message %q", done.Attempts[0].Message)
	}
}

func TestGPUsAreWholeAndNeverShared(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 16, 2)
	controlplanetest.Eventually(t, 10*time.Second, "machine online", func() bool {
		r, err := v1.NewPoolServiceClient(b.in.Conn).ListPools(b.ctx, &v1.ListPoolsRequest{})
		return err == nil && r.Pools[0].GpusTotal == 2
	})
	if _, err := b.tasks.SubmitTask(b.ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Gpus: 3}}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("3 GPUs on a 2-GPU machine: %v", err)
	}
	one := b.submit(t, &v1.TaskSpec{Command: []string{"sleep"}, Gpus: 1}, "")
	two := b.submit(t, &v1.TaskSpec{Command: []string{"sleep"}, Gpus: 1}, "")
	three := b.submit(t, &v1.TaskSpec{Command: []string{"sleep"}, Gpus: 1}, "")
	waitState(t, b, one.Id, v1.TaskState_TASK_STATE_RUNNING)
	waitState(t, b, two.Id, v1.TaskState_TASK_STATE_RUNNING)
	holds(t, 1500*time.Millisecond, "the third 1-GPU task on a 2-GPU machine stays pending", func() bool {
		r, err := b.tasks.GetTask(b.ctx, &v1.GetTaskRequest{Id: three.Id})
		return err == nil && r.Task.State == v1.TaskState_TASK_STATE_PENDING
	})
	if _, err := b.tasks.CancelTask(b.ctx, &v1.CancelTaskRequest{Id: one.Id}); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, three.Id, v1.TaskState_TASK_STATE_RUNNING)
}

// Two replicas share Postgres and Redis, each with agents on its tunnel,
// and both schedule: every task runs exactly once.
func TestTwoReplicasNeverPlaceATaskTwice(t *testing.T) {
	t.Parallel()
	cfg := config1s(t)
	b := start(t, cfg)
	cfg2 := *cfg
	cfg2.Controlplane.GRPCAddr, cfg2.Controlplane.RESTAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg2.Controlplane.TunnelAddr = freeTunnelAddr(t)
	in2 := controlplanetest.Start(t, &cfg2, true)
	controlplanetest.Eventually(t, 10*time.Second, "second tunnel endpoint", func() bool { return in2.Server.Agents() != nil })
	b2 := &bundle{in: in2, ctx: b.ctx, tasks: v1.NewTaskServiceClient(in2.Conn)}
	agents := []*controlplanetest.ScriptedMachine{
		controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0), controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0),
		controlplanetest.StartScriptedMachine(t, in2, b.ctx, "default", 2, 0), controlplanetest.StartScriptedMachine(t, in2, b.ctx, "default", 2, 0),
	}
	const n = 40
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			via := b
			if i%2 == 1 {
				via = b2
			}
			resp, err := via.tasks.SubmitTask(via.ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: []string{"sleep", "50ms"}}})
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = resp.Task.Id
		}()
	}
	wg.Wait()
	for _, id := range ids {
		waitState(t, b, id, v1.TaskState_TASK_STATE_SUCCEEDED)
	}
	count := map[string]int{}
	for _, a := range agents {
		for _, k := range a.Started() {
			count[strings.Split(k, "/")[0]]++
		}
	}
	for _, id := range ids {
		if count[id] != 1 {
			t.Errorf("task %s started %d times", id, count[id])
		}
	}
	r, err := b.tasks.GetTask(b.ctx, &v1.GetTaskRequest{Id: ids[0]})
	if err != nil || len(r.Task.Attempts) != 1 {
		t.Errorf("attempts %v %v", r, err)
	}
}

// secondWorkspace seeds another workspace with an admin token straight into
// the store (there is no API to create workspaces yet).
func secondWorkspace(t *testing.T, b *bundle) *bundle {
	t.Helper()
	return workspaceNamed(t, b, "second")
}

// workspaceNamed seeds a workspace called name, as secondWorkspace does.
func workspaceNamed(t *testing.T, b *bundle, name string) *bundle {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, b.in.Config.Database.Postgres.ConnString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ws := store.Workspace{ID: ids.New("ws"), Name: name, CreatedAt: time.Now()}
	if err := st.CreateWorkspace(ctx, ws); err != nil {
		t.Fatal(err)
	}
	id, tok, hash := auth.Mint()
	if err := st.CreateToken(ctx, store.Token{ID: id, WorkspaceID: ws.ID, Name: "admin", Role: store.RoleAdmin, Hash: hash, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return &bundle{in: b.in, ctx: metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok), tasks: b.tasks}
}

func freeTunnelAddr(t *testing.T) string {
	p, err := devstack.FreeTCPUDPPort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

func TestListPagesNewestFirst(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	var ids []string
	for i := 0; i < 5; i++ {
		ids = append(ids, b.submit(t, &v1.TaskSpec{Command: []string{"echo", fmt.Sprint(i)}}, "").Id)
	}
	if _, err := b.tasks.CancelTask(b.ctx, &v1.CancelTaskRequest{Id: ids[0]}); err != nil {
		t.Fatal(err)
	}
	var got []string
	token := ""
	for page := 0; page < 5; page++ {
		r, err := b.tasks.ListTasks(b.ctx, &v1.ListTasksRequest{PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range r.Tasks {
			got = append(got, task.Id)
		}
		if token = r.NextPageToken; token == "" {
			break
		}
	}
	want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pages gave %v, want %v", got, want)
	}
	r, err := b.tasks.ListTasks(b.ctx, &v1.ListTasksRequest{States: []v1.TaskState{v1.TaskState_TASK_STATE_CANCELLED}})
	if err != nil || len(r.Tasks) != 1 || r.Tasks[0].Id != ids[0] {
		t.Errorf("cancelled only: %v %v", r, err)
	}
	for _, bad := range []*v1.ListTasksRequest{{PageToken: "nope"}, {PageSize: 501}, {States: []v1.TaskState{42}}} {
		if _, err := b.tasks.ListTasks(b.ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

// A push that meets the machine's session closing (the agent restarting
// just as the task reaches it) is sent again on its next session: with no
// retries the task still runs, once, as attempt 1. A machine that keeps
// dropping it loses the attempt after a bounded number of re-sends.
func TestPushRacingAReconnectIsSentAgain(t *testing.T) {
	if raceEnabled {
		// Its bounds are wall-clock ones (backoffs inside the grace, the
		// machine's redial); the plain test step runs it.
		t.Skip("timing-bound: runs without the race detector")
	}
	t.Parallel()
	cfg := config1s(t)
	cfg.Controlplane.LostAgentGrace = "10s"
	b := start(t, cfg)
	m := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	// At most 2 drops in a row: a re-send may also meet the old session
	// before the hub has noticed it closed, and 3 re-sends must cover both.
	for i, drops := range []int{1, 2, 1, 2, 1} {
		m.DropSessionOnRun(drops)
		task := b.submit(t, &v1.TaskSpec{Command: []string{"echo", fmt.Sprint(i)}}, "")
		// Each drop costs a redial and a re-send backoff; a loaded machine
		// (the whole suite at once) stretches both, so the budget is wide
		// and a miss says where the task stood.
		var done *v1.Task
		deadline := time.Now().Add(45 * time.Second)
		for done == nil || done.State != v1.TaskState_TASK_STATE_SUCCEEDED {
			if time.Now().After(deadline) {
				t.Fatalf("task %d (%d dropped pushes) not done after 45s: %v\ncontrolplane log:\n%s", i, drops, done, b.in.Logs.String())
			}
			time.Sleep(50 * time.Millisecond)
			if r, err := b.tasks.GetTask(b.ctx, &v1.GetTaskRequest{Id: task.Id}); err == nil {
				done = r.Task
			}
		}
		if len(done.Attempts) != 1 || done.Attempts[0].State != v1.AttemptState_ATTEMPT_STATE_SUCCEEDED {
			t.Fatalf("task %d (%d dropped pushes): attempts %v\ncontrolplane log:\n%s", i, drops, done.Attempts, b.in.Logs.String())
		}
	}
	// 7 pushes were dropped; a re-send can also find the machine not yet
	// back on its next session, which is one more.
	if n := len(b.in.Logs.Find("push met a closing session")); n < 7 {
		t.Errorf("%d re-sends logged, want at least 7", n)
	}
	m.DropSessionOnRun(100)
	task := b.submit(t, &v1.TaskSpec{Command: []string{"echo", "never"}}, "")
	failed := waitState(t, b, task.Id, v1.TaskState_TASK_STATE_FAILED)
	if len(failed.Attempts) != 1 || failed.Attempts[0].State != v1.AttemptState_ATTEMPT_STATE_LOST ||
		!strings.Contains(failed.Attempts[0].Message, "could not be started") {
		t.Fatalf("a machine that always drops the push: attempts %v", failed.Attempts)
	}
	for _, s := range m.Started() {
		if strings.HasPrefix(s, task.Id) {
			t.Fatalf("the dropped task started: %v", m.Started())
		}
	}
}
