package sdk

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/levers9/levers9/controlplane/controlplanetest"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/testenv"
)

// TestTasksAgainstRealControlplane: what a real controlplane answers,
// through the SDK, with no machine to run anything: submit, idempotency,
// get, cancel of a pending task, follow of a cancelled task ends,
// refusals that read well.
func TestTasksAgainstRealControlplane(t *testing.T) {
	t.Parallel()
	b := startReal(t, "1s")
	c := b.client(t)
	ctx := context.Background()

	spec, err := c.Function("idem", Command("sleep")).Spec()
	if err != nil {
		t.Fatal(err)
	}
	first, err := c.Submit(ctx, spec, "sdktest-key-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Submit(ctx, spec, "sdktest-key-1")
	if err != nil || again.Id != first.Id {
		t.Fatalf("same key: %v, %v (first %s)", again.GetId(), err, first.Id)
	}
	got, err := c.Task(ctx, first.Id)
	if err != nil || got.State != v1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("get: %v %v", got, err)
	}
	cancelled, err := c.Cancel(ctx, first.Id)
	if err != nil || cancelled.State != v1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("cancel: %v %v", cancelled, err)
	}
	var states []string
	fctx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if err := c.Follow(fctx, first.Id, "", func(ev *TaskEvent) error {
		if s := ev.GetState(); s != nil {
			states = append(states, StateName(s.TaskState))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(states, " ") != "pending cancelled" {
		t.Errorf("follow of a cancelled task: %v", states)
	}
	res, err := c.Wait(fctx, first.Id)
	var te *TaskError
	if !errors.As(err, &te) || res.State != v1.TaskState_TASK_STATE_CANCELLED || !strings.Contains(err.Error(), "was cancelled") {
		t.Errorf("wait: %+v %v", res, err)
	}

	// Refusals come back readable, with their code, and nothing runs.
	tests := []struct {
		name string
		fn   *Function
		code codes.Code
		want string
	}{
		{"gpu", c.Function("g", GPU(1, "")), codes.FailedPrecondition, "has no GPUs"},
		{"looser seccomp", c.Function("s", Env("LEVERS9_SECCOMP", "off")), codes.PermissionDenied, `LEVERS9_SECCOMP: "off" is looser than the pool's`},
		{"unknown pool", c.Function("p", Pool("nope")), codes.Unknown, "nope"},
		{"bad option", c.Function("o", CPU(-1)), codes.Unknown, "CPU"},
	}
	for _, tt := range tests {
		_, err := tt.fn.Remote(ctx, "true")
		if err == nil || !strings.Contains(err.Error(), tt.want) || (tt.code != codes.Unknown && status.Code(err) != tt.code) ||
			strings.Contains(err.Error(), "rpc error") {
			t.Errorf("%s: %v (code %v)", tt.name, err, status.Code(err))
		}
	}
	// The environment's tightening reaches the controlplane too.
	env := map[string]string{"LEVERS9_CONTROLPLANE": b.relay.addr, "LEVERS9_TOKEN": b.token, "LEVERS9_SECURITY_PROFILE": "legacy"}
	lc, err := NewClient(ctx, WithGetenv(func(k string) string { return env[k] }))
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	if _, err := lc.Function("l").Submit(ctx, "true"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a looser profile from the environment: %v", err)
	}
}

// TestRemoteEndToEnd: output and exit codes through a real controlplane
// and a machine on a real tunnel.
func TestRemoteEndToEnd(t *testing.T) {
	t.Parallel()
	b := startReal(t, "1s")
	controlplanetest.StartScriptedMachine(t, b.in, b.admin, "default", 4, 0)
	c := b.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	res, err := c.Function("echo", Command("echo")).Remote(ctx, "hello", "world")
	if err != nil || res.Stdout != "hello\nworld\n" || res.State != v1.TaskState_TASK_STATE_SUCCEEDED || res.Attempts != 1 {
		t.Fatalf("echo: %+v %v", res, err)
	}
	res, err = c.Function("exit", Command("exit")).Remote(ctx, "3")
	var te *TaskError
	if !errors.As(err, &te) || te.ExitCode != 3 || res.ExitCode == nil || *res.ExitCode != 3 || !strings.Contains(err.Error(), "exited with code 3") {
		t.Errorf("exit 3: %+v %v", res, err)
	}

	// Cancelling ctx cancels the running task.
	sctx, scancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	var sres *Result
	go func() {
		var err error
		sres, err = c.Function("sleep", Command("sleep")).Remote(sctx)
		done <- err
	}()
	var id string
	testenv.Eventually(t, 20*time.Second, "a running task", func() bool {
		l, err := c.tasks.ListTasks(c.authed(ctx), &v1.ListTasksRequest{States: []v1.TaskState{v1.TaskState_TASK_STATE_RUNNING}})
		if err == nil && len(l.Tasks) == 1 {
			id = l.Tasks[0].Id
		}
		return id != ""
	})
	scancel()
	rerr := <-done
	if !errors.Is(rerr, context.Canceled) {
		t.Errorf("cancelled Remote: %v", rerr)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		tk, err := c.Task(ctx, id)
		if err == nil && tk.State == v1.TaskState_TASK_STATE_CANCELLED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not cancelled: %v %v (Remote gave %+v, %v)\ncontrolplane log:\n%s", id, tk, err, sres, rerr, b.in.Logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sres == nil || sres.TaskID != id {
		t.Errorf("result of a cancelled Remote: %+v", sres)
	}
}

// TestRemoteCancelledDuringSubmit: when ctx ends while the submit's reply
// is on its way, the task the controlplane made is still cancelled, not
// left to run with nobody waiting for it.
func TestRemoteCancelledDuringSubmit(t *testing.T) {
	t.Parallel()
	b := startReal(t, "1s")
	creds := insecure.NewCredentials()
	if f := b.cfg.Controlplane.TLS.CertFile; f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		creds = credentials.NewTLS(&tls.Config{RootCAs: roots})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	var cut atomic.Bool
	// The first submit reaches the controlplane; its reply is lost as the
	// caller's ctx ends.
	loseReply := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if strings.HasSuffix(method, "/SubmitTask") && err == nil && cut.CompareAndSwap(false, true) {
			scancel()
			return status.Error(codes.Canceled, "context canceled")
		}
		return err
	}
	conn, err := grpc.NewClient(b.in.Server.GRPCAddr(),
		grpc.WithTransportCredentials(creds),
		grpc.WithUnaryInterceptor(loseReply))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := b.client(t, WithConn(conn, b.token))

	res, err := c.Function("sleep", Command("sleep")).Remote(sctx)
	if !errors.Is(err, context.Canceled) || res == nil || res.TaskID == "" {
		t.Fatalf("Remote cancelled during submit: %+v, %v", res, err)
	}
	tk, err := c.Task(ctx, res.TaskID)
	if err != nil || tk.State != v1.TaskState_TASK_STATE_CANCELLED {
		t.Fatalf("task %s after its Remote was cancelled: %v %v", res.TaskID, tk, err)
	}
	l, err := c.tasks.ListTasks(c.authed(ctx), &v1.ListTasksRequest{})
	if err != nil || len(l.Tasks) != 1 {
		t.Fatalf("tasks: %v %v (want the one cancelled task)", l, err)
	}
}

// TestFollowAcrossCutsAndRestart: a follow whose connection is cut and
// whose controlplane is replaced mid-task resumes from its cursor, and
// every line arrives once, in order.
func TestFollowAcrossCutsAndRestart(t *testing.T) {
	t.Parallel()
	// The machine must outlast the restart.
	b := startReal(t, "60s")
	controlplanetest.StartScriptedMachine(t, b.in, b.admin, "default", 4, 0)
	c := b.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	task, err := c.Function("count", Command("count", "60", "40ms")).Submit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	seen := map[string]bool{}
	err = c.Follow(ctx, task.Id, "", func(ev *TaskEvent) error {
		if seen[ev.Cursor] {
			t.Errorf("cursor %s twice", ev.Cursor)
		}
		seen[ev.Cursor] = true
		if l := ev.GetLog(); l != nil {
			lines = append(lines, l.Text)
			switch len(lines) {
			case 10, 25:
				b.relay.cut()
			case 35:
				go b.restart(t)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]string, 60)
	for i := range want {
		want[i] = fmt.Sprintf("line-%d", i)
	}
	if strings.Join(lines, ",") != strings.Join(want, ",") {
		t.Errorf("lines:\n got %v\nwant %v", lines, want)
	}
}

// TestRemoteAcrossLostMachine: the machine running a task goes away; the
// task's new attempt runs on another and Remote returns its result.
func TestRemoteAcrossLostMachine(t *testing.T) {
	t.Parallel()
	b := startReal(t, "1s")
	first := controlplanetest.StartScriptedMachine(t, b.in, b.admin, "default", 2, 0)
	c := b.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	var res *Result
	go func() {
		var err error
		res, err = c.Function("lost", Command("sleep", "1s"), Retries(1)).Remote(ctx)
		done <- err
	}()
	testenv.Eventually(t, 20*time.Second, "the first attempt running", func() bool { return first.PeakRunning() == 1 })
	controlplanetest.StartScriptedMachine(t, b.in, b.admin, "default", 2, 0)
	first.Stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 2 || res.State != v1.TaskState_TASK_STATE_SUCCEEDED {
		t.Errorf("result %+v", res)
	}
}

// TestMapOnRealControlplane: results in input order, never more tasks
// running than asked.
func TestMapOnRealControlplane(t *testing.T) {
	t.Parallel()
	b := startReal(t, "1s")
	a := controlplanetest.StartScriptedMachine(t, b.in, b.admin, "default", 8, 0)
	c := b.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var inputs [][]string
	for i := range 6 {
		inputs = append(inputs, []string{"count", "1", fmt.Sprintf("%dms", 300-40*i)})
	}
	inputs[3] = []string{"exit", "4"}
	res, errs := c.Function("map").Map(ctx, inputs, Concurrency(2))
	for i := range inputs {
		if i == 3 {
			if res[i] == nil || res[i].ExitCode == nil || *res[i].ExitCode != 4 || errs[i] == nil {
				t.Errorf("input 3: %+v %v", res[i], errs[i])
			}
			continue
		}
		if errs[i] != nil || res[i].Stdout != "line-0\n" {
			t.Errorf("input %d: %+v %v", i, res[i], errs[i])
		}
	}
	if p := a.PeakRunning(); p > 2 || p < 1 {
		t.Errorf("peak running %d, want at most 2", p)
	}
}
