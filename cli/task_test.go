package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sdk/sdktest"
)

// taskCLI runs the CLI against a task service at addr, with interrupts
// from its own channel.
type taskCLI struct {
	env  map[string]string
	sigs chan os.Signal
	// stdin is what the CLI reads from standard input.
	stdin string
}

func newTaskCLI(t *testing.T, addr, token string) *taskCLI {
	return &taskCLI{
		env:  map[string]string{"LEVERS9_HOME": t.TempDir(), "LEVERS9_CONTROLPLANE": addr, "LEVERS9_TOKEN": token},
		sigs: make(chan os.Signal, 4),
	}
}

type cliRun struct {
	out, err *testenv.SyncBuffer
	code     chan int
}

// start runs the CLI in the background.
func (c *taskCLI) start(args ...string) *cliRun {
	r := &cliRun{out: &testenv.SyncBuffer{}, err: &testenv.SyncBuffer{}, code: make(chan int, 1)}
	notify := func() (<-chan os.Signal, func()) { return c.sigs, func() {} }
	getenv := func(k string) string { return c.env[k] }
	go func() {
		r.code <- mainWith(args, IO{In: strings.NewReader(c.stdin), Out: r.out, Err: r.err}, getenv, notify)
	}()
	return r
}

func (r *cliRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-r.code:
		return code
	case <-time.After(20 * time.Second):
		t.Fatalf("the CLI did not return; stdout %q stderr %q", r.out, r.err)
		return -1
	}
}

func (c *taskCLI) run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	r := c.start(args...)
	code := r.wait(t)
	return r.out.String(), r.err.String(), code
}

func TestRunFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		f    runFlags
		want []string // substrings of the error; none: valid
	}{
		{name: "defaults", f: runFlags{}},
		{name: "everything", f: runFlags{pool: "gpu", gpus: 2, gpuType: "A100", image: "x", memory: "4Gi", cpu: 1.5, timeout: time.Hour, retries: 2, env: []string{"A=1", "B=x=y", "C="}}},
		{name: "bad memory", f: runFlags{memory: "5zz"}, want: []string{`--memory "5zz"`}},
		{name: "env without =", f: runFlags{env: []string{"NOEQUALS"}}, want: []string{`--env "NOEQUALS"`, "KEY=VALUE"}},
		{name: "env bad key", f: runFlags{env: []string{"1A=x", "=x"}}, want: []string{`"1A=x"`, `"=x"`}},
		{name: "all at once", f: runFlags{gpus: -1, cpu: -2, retries: -1, timeout: -time.Second, memory: "10"},
			want: []string{"--gpu -1", "--cpu -2", "--retries -1", "--timeout -1s", `--memory "10"`}},
		{name: "gpu type alone", f: runFlags{gpuType: "A100"}, want: []string{"--gpu-type A100 needs --gpu"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.f.options()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "nothing was submitted") {
				t.Fatalf("err = %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}
}

func TestParseMemory(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"512Mi", 512 << 20, true}, {"2Gi", 2 << 30, true}, {"1.5Gi", 3 << 29, true}, {"1G", 1e9, true},
		{"500M", 500e6, true}, {"1048576", 1 << 20, true}, {"4GiB", 4 << 30, true}, {"256mi", 256 << 20, true},
		{"5zz", 0, false}, {"", 0, false}, {"-1Gi", 0, false}, {"10", 0, false}, {"1Ki", 0, false}, {"Gi", 0, false}, {"2Ei0", 0, false},
	}
	for _, tt := range tests {
		got, err := parseMemory(tt.in)
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("parseMemory(%q) = %d, %v", tt.in, got, err)
		}
	}
}

func TestParseStates(t *testing.T) {
	t.Parallel()
	got, err := parseStates([]string{"running,pending", "timed-out", "TIMED_OUT"})
	want := []v1.TaskState{v1.TaskState_TASK_STATE_RUNNING, v1.TaskState_TASK_STATE_PENDING, v1.TaskState_TASK_STATE_TIMED_OUT, v1.TaskState_TASK_STATE_TIMED_OUT}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseStates = %v, %v", got, err)
	}
	for _, bad := range []string{"done", "unspecified"} {
		if _, err := parseStates([]string{bad}); err == nil || !strings.Contains(err.Error(), "want one of pending") {
			t.Errorf("parseStates(%q) = %v", bad, err)
		}
	}
}

func TestExitFor(t *testing.T) {
	t.Parallel()
	lost := []*v1.Attempt{{Number: 1, State: v1.AttemptState_ATTEMPT_STATE_LOST, Message: "tunnel gone"}}
	tests := []struct {
		task *v1.Task
		code int
		msg  string
	}{
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_SUCCEEDED}, 0, ""},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, ExitCode: proto.Int32(3)}, 3, ""},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, ExitCode: proto.Int32(137)}, 137, ""},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, ExitCode: proto.Int32(300)}, 1, "exited with code 300"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, ExitCode: proto.Int32(-1)}, 1, "exited with code -1"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_TIMED_OUT, ExitCode: proto.Int32(137)}, 124, "timed out"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_CANCELLED}, 1, "task t1 was cancelled"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, Attempts: lost}, 1, "lost its machine on attempt 1 with no retries left: tunnel gone"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, Message: "image not found"}, 1, "failed: image not found"},
	}
	for _, tt := range tests {
		err := exitFor(tt.task)
		code, msg := 0, ""
		if ee, ok := err.(*exitError); ok {
			code, msg = ee.code, ee.msg
		} else if err != nil {
			t.Fatalf("exitFor returned %T", err)
		}
		if code != tt.code || !strings.Contains(msg, tt.msg) || (tt.msg == "" && msg != "") {
			t.Errorf("exitFor(%v) = %d %q, want %d %q", tt.task, code, msg, tt.code, tt.msg)
		}
	}
}

// runScripted starts `levers9 run` against a scripted service and returns
// the run and the ID of the task it submitted.
func runScripted(t *testing.T, srv *sdktest.Server, c *taskCLI, args ...string) (*cliRun, string) {
	t.Helper()
	before, followers := len(srv.Tasks()), len(srv.Follows())
	r := c.start(append([]string{"run"}, args...)...)
	sdktest.WaitFor(t, "a submit", func() bool { return len(srv.Tasks()) > before })
	id := srv.Tasks()[before]
	if !slices.Contains(args, "--detach") {
		sdktest.WaitFor(t, "a follower", func() bool { return len(srv.Follows()) > followers })
	}
	return r, id
}

// TestRunStreamsAcrossAttempts: one stream of output across two attempts,
// with a marker where the second began, and the task's exit code.
func TestRunStreamsAcrossAttempts(t *testing.T) {
	t.Parallel()
	srv := sdktest.Start(t)
	c := newTaskCLI(t, srv.Addr, sdktest.Token)
	r, id := runScripted(t, srv, c, "--retries", "1", "--", "sh", "-c", "work")
	srv.StartAttempt(id, "m_a")
	srv.Log(id, v1.LogStream_LOG_STREAM_STDOUT, "one", "two")
	srv.LoseAttempt(id, "spot reclaimed", false)
	srv.StartAttempt(id, "m_b")
	srv.Log(id, v1.LogStream_LOG_STREAM_STDOUT, "three")
	srv.Log(id, v1.LogStream_LOG_STREAM_STDERR, "oops")
	srv.Finish(id, v1.TaskState_TASK_STATE_FAILED, 3, "")
	if code := r.wait(t); code != 3 {
		t.Errorf("exit code %d, want 3; stderr %q", code, r.err)
	}
	if got := r.out.String(); got != "one\ntwo\nthree\n" {
		t.Errorf("stdout %q", got)
	}
	if got := r.err.String(); got != "--- attempt 2 on machine m_b (attempt 1 lost: spot reclaimed)\noops\n" {
		t.Errorf("stderr %q", got)
	}

	// Timed out: 124, like timeout(1).
	r, id = runScripted(t, srv, c, "--timeout", "1s", "--", "sleep", "9")
	srv.StartAttempt(id, "m_a")
	srv.Finish(id, v1.TaskState_TASK_STATE_TIMED_OUT, 137, "")
	if code := r.wait(t); code != 124 || !strings.Contains(r.err.String(), "timed out after 1s") {
		t.Errorf("timeout: code %d, stderr %q", code, r.err)
	}
}

func TestRunInterrupts(t *testing.T) {
	t.Parallel()
	srv := sdktest.Start(t)
	srv.HoldCancels()
	c := newTaskCLI(t, srv.Addr, sdktest.Token)

	// First Ctrl-C cancels and keeps following to the end.
	r, id := runScripted(t, srv, c, "--", "sleep", "100")
	srv.StartAttempt(id, "m_a")
	srv.Log(id, v1.LogStream_LOG_STREAM_STDOUT, "before")
	c.sigs <- syscall.SIGINT
	sdktest.WaitFor(t, "a cancel", func() bool { return len(srv.Cancels()) == 1 })
	srv.Log(id, v1.LogStream_LOG_STREAM_STDOUT, "while cancelling")
	srv.Finish(id, v1.TaskState_TASK_STATE_CANCELLED, 0, "cancelled by a user")
	if code := r.wait(t); code != 1 {
		t.Errorf("cancelled: code %d", code)
	}
	if r.out.String() != "before\nwhile cancelling\n" || !strings.Contains(r.err.String(), "cancelling task "+id) ||
		!strings.Contains(r.err.String(), "task "+id+" was cancelled") {
		t.Errorf("cancelled: stdout %q stderr %q", r.out, r.err)
	}

	// A second Ctrl-C detaches and says how to resume; the task goes on.
	r, id = runScripted(t, srv, c, "--", "sleep", "100")
	c.sigs <- syscall.SIGINT
	sdktest.WaitFor(t, "a cancel", func() bool { return len(srv.Cancels()) == 2 })
	c.sigs <- syscall.SIGINT
	if code := r.wait(t); code != 130 || !strings.Contains(r.err.String(), "levers9 task logs -f "+id) {
		t.Errorf("detach: code %d stderr %q", code, r.err)
	}

	// task logs -f picks it up and exits with its code; Ctrl-C there
	// detaches at once without cancelling.
	lr := c.start("task", "logs", "-f", id)
	sdktest.WaitFor(t, "a follower", func() bool { return len(srv.Follows()) >= 3 })
	srv.StartAttempt(id, "m_a")
	srv.Log(id, v1.LogStream_LOG_STREAM_STDOUT, "late")
	srv.Finish(id, v1.TaskState_TASK_STATE_FAILED, 5, "")
	if code := lr.wait(t); code != 5 || lr.out.String() != "late\n" {
		t.Errorf("logs -f: code %d stdout %q stderr %q", code, lr.out, lr.err)
	}
	r, _ = runScripted(t, srv, c, "--detach", "--", "sleep", "100")
	if code := r.wait(t); code != 0 {
		t.Fatal(r.err)
	}
	id = strings.TrimSpace(r.out.String())
	lr = c.start("task", "logs", "-f", id)
	sdktest.WaitFor(t, "a follower", func() bool { return len(srv.Follows()) >= 4 })
	c.sigs <- syscall.SIGINT
	if code := lr.wait(t); code != 130 || len(srv.Cancels()) != 2 {
		t.Errorf("logs -f Ctrl-C: code %d, cancels %v", code, srv.Cancels())
	}
}

func TestRunRefusesBadInputBeforeSubmitting(t *testing.T) {
	t.Parallel()
	srv := sdktest.Start(t)
	c := newTaskCLI(t, srv.Addr, sdktest.Token)
	tests := [][]string{
		{"run", "--memory", "5zz", "--", "true"},
		{"run", "--env", "NOEQUALS", "--", "true"},
		{"run", "--gpu", "x", "--", "true"},
		{"run", "--nope", "--", "true"},
		{"run", "--cpu", "0", "--memory", "1Ki", "--", "true"},
		{"run"},
	}
	for _, args := range tests {
		_, errOut, code := c.run(t, args...)
		if code != 1 || errOut == "" {
			t.Errorf("%v: code %d, stderr %q", args, code, errOut)
		}
	}
	if srv.Submits() != 0 {
		t.Errorf("bad input submitted %d tasks", srv.Submits())
	}
	// CMD's own flags are not levers9's.
	r := c.start("run", "--detach", "ls", "-la", "--timeout", "x")
	if code := r.wait(t); code != 0 || srv.Submits() != 1 {
		t.Errorf("flags after CMD: code %d stderr %q", code, r.err)
	}
}

func TestTaskCommandsScripted(t *testing.T) {
	t.Parallel()
	srv := sdktest.Start(t)
	c := newTaskCLI(t, srv.Addr, sdktest.Token)
	out, errOut, code := c.run(t, "run", "--detach", "--env", "SECRET_NAME=x",
		"--volume", "data:/data", "--volume", "ref:/ref:ro", "--", "echo", "hello world")
	if code != 0 {
		t.Fatal(errOut)
	}
	id := strings.TrimSpace(out)
	srv.StartAttempt(id, "m_a")
	srv.Log(id, v1.LogStream_LOG_STREAM_STDOUT, "so far")

	// logs without -f prints what there is and returns while it runs.
	out, errOut, code = c.run(t, "task", "logs", id)
	if code != 0 || out != "so far\n" {
		t.Errorf("logs: %d %q %q", code, out, errOut)
	}
	out, _, code = c.run(t, "task", "show", id)
	if code != 0 || !regexp.MustCompile(`(?m)^1\s+running\s+m_a`).MatchString(out) || !strings.Contains(out, "echo 'hello world'") ||
		!strings.Contains(out, "SECRET_NAME") || strings.Contains(out, "=x") ||
		!regexp.MustCompile(`(?m)^Volumes:\s+data:/data, ref:/ref:ro$`).MatchString(out) {
		t.Errorf("show: %q", out)
	}
	out, _, code = c.run(t, "task", "list")
	if code != 0 || !regexp.MustCompile(id+`\s+running`).MatchString(out) {
		t.Errorf("list: %q", out)
	}
	out, _, code = c.run(t, "task", "list", "-o", "json")
	var list struct{ Tasks []struct{ ID, State string } }
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Tasks) != 1 || list.Tasks[0].ID != id || list.Tasks[0].State != "TASK_STATE_RUNNING" {
		t.Errorf("list json: %q", out)
	}
	out, _, code = c.run(t, "task", "cancel", id)
	if code != 0 || out != "task "+id+" cancelled\n" {
		t.Errorf("cancel: %q", out)
	}
	// Cancelling is idempotent; a task that finished otherwise says so.
	if out, _, code = c.run(t, "task", "cancel", id); code != 0 || out != "task "+id+" cancelled\n" {
		t.Errorf("cancel again: %q", out)
	}
	out, _, _ = c.run(t, "run", "--detach", "--", "true")
	done := strings.TrimSpace(out)
	srv.StartAttempt(done, "m_a")
	srv.Finish(done, v1.TaskState_TASK_STATE_SUCCEEDED, 0, "")
	if out, _, _ = c.run(t, "task", "cancel", done); out != "task "+done+" had already finished: succeeded\n" {
		t.Errorf("cancel of a finished task: %q", out)
	}
	// An exit code shows as such, 0 included; a task that ended without
	// one shows "-", in the table and (absent) in JSON.
	if out, _, _ = c.run(t, "task", "show", done); !regexp.MustCompile(`(?m)^Exit code:\s+0$`).MatchString(out) {
		t.Errorf("show of a succeeded task: %q", out)
	}
	out, _, _ = c.run(t, "run", "--detach", "--", "true")
	lost := strings.TrimSpace(out)
	srv.StartAttempt(lost, "m_a")
	srv.LoseAttempt(lost, "machine m_a went away", true)
	out, _, _ = c.run(t, "task", "show", lost)
	if !regexp.MustCompile(`(?m)^Exit code:\s+-$`).MatchString(out) || !regexp.MustCompile(`(?m)^1\s+lost\s+m_a\s.*\s-\s+0\s+machine m_a went away$`).MatchString(out) {
		t.Errorf("show of a task lost without an exit code: %q", out)
	}
	for id, want := range map[string]bool{done: true, lost: false} {
		out, _, _ = c.run(t, "task", "show", id, "-o", "json")
		var shown struct {
			Task struct {
				ExitCode *int `json:"exitCode"`
				Attempts []struct {
					ExitCode *int `json:"exitCode"`
				}
			}
		}
		err := json.Unmarshal([]byte(out), &shown)
		if tk := shown.Task; err != nil || (tk.ExitCode != nil) != want || len(tk.Attempts) != 1 || (tk.Attempts[0].ExitCode != nil) != want {
			t.Errorf("show -o json of %s: has an exit code %v, want %v: %s", id, tk.ExitCode != nil, want, out)
		}
	}
	_, errOut, code = c.run(t, "task", "show", "t_nope")
	if code != 1 || !strings.Contains(errOut, "task t_nope not found") {
		t.Errorf("show missing: %d %q", code, errOut)
	}
	for _, cmd := range []string{"run", "task list", "task show", "task logs", "task cancel"} {
		out, _, code := c.run(t, append(strings.Fields(cmd), "--help")...)
		if code != 0 || !strings.Contains(out, "Examples:") {
			t.Errorf("%s --help lacks an example: %q", cmd, out)
		}
	}
}

// TestRunInterruptDuringSubmit: a Ctrl-C before the submit's reply waits
// for it and cancels the task, instead of leaving a task nobody follows.
func TestRunInterruptDuringSubmit(t *testing.T) {
	t.Parallel()
	srv := sdktest.Start(t)
	srv.LoseSubmitReplies(2)
	c := newTaskCLI(t, srv.Addr, sdktest.Token)
	c.sigs <- syscall.SIGINT
	out, errOut, code := c.run(t, "run", "--", "sleep", "100")
	if code != 1 || len(srv.Tasks()) != 1 || !slices.Equal(srv.Cancels(), srv.Tasks()) ||
		!strings.Contains(errOut, "will cancel the task once submitted") || !strings.Contains(errOut, "was cancelled") {
		t.Errorf("code %d, tasks %v, cancels %v, stdout %q, stderr %q", code, srv.Tasks(), srv.Cancels(), out, errOut)
	}
}

func TestStreamPrinterMarkers(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	p := newStreamPrinter(&out, &errb, false)
	state := func(attempt int32, sc *v1.StateChange) *v1.TaskEvent {
		return &v1.TaskEvent{Attempt: attempt, Event: &v1.TaskEvent_State{State: sc}}
	}
	for _, ev := range []*v1.TaskEvent{
		state(1, &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_RUNNING, MachineId: "m_a"}),
		{Attempt: 1, Event: &v1.TaskEvent_Log{Log: &v1.LogLine{Stream: v1.LogStream_LOG_STREAM_STDOUT, Text: "x", DroppedBefore: 3}}},
		state(1, &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_PENDING, AttemptState: v1.AttemptState_ATTEMPT_STATE_LOST,
			Message: "attempt 1 lost: machine m_a has been offline for 2.1s; retrying"}),
		state(2, &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_SCHEDULED, MachineId: "m_b", NewAttempt: true}),
	} {
		if err := p.event(ev); err != nil {
			t.Fatal(err)
		}
	}
	want := "--- 3 lines dropped here (output came faster than it could be shipped)\n" +
		"--- attempt 2 on machine m_b (attempt 1 lost: machine m_a has been offline for 2.1s)\n"
	if out.String() != "x\n" || errb.String() != want {
		t.Errorf("stdout %q\nstderr %q\nwant   %q", out.String(), errb.String(), want)
	}
}

// realTaskCLI is the CLI with a context on a real (TLS) controlplane.
func realTaskCLI(t *testing.T) *taskCLI {
	t.Helper()
	b := setup(t)
	if _, errOut, code := b.run(t, "\n", map[string]string{"LEVERS9_BOOTSTRAP_SECRET": "test-bootstrap-secret-0123456789abcdef"},
		"config", "create", "p", "--controlplane", b.addr, "--tls", "--ca", b.cert); code != 0 {
		t.Fatal(errOut)
	}
	return &taskCLI{env: map[string]string{"LEVERS9_HOME": b.home}, sigs: make(chan os.Signal, 4)}
}

// taskIDs lists the tasks through the CLI, newest first.
func (c *taskCLI) taskIDs(t *testing.T, args ...string) []string {
	t.Helper()
	out, errOut, code := c.run(t, append([]string{"task", "list", "-o", "json"}, args...)...)
	var list struct{ Tasks []struct{ ID string } }
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("task list: %q %q", out, errOut)
	}
	var ids []string
	for _, tk := range list.Tasks {
		ids = append(ids, tk.ID)
	}
	return ids
}

// TestRunRealControlplane: the CLI against a real controlplane with no
// machine, so tasks stay pending: refusals before anything runs, Ctrl-C
// cancelling a pending task, a second Ctrl-C detaching, and the task
// commands.
func TestRunRealControlplane(t *testing.T) {
	t.Parallel()
	c := realTaskCLI(t)

	_, errOut, code := c.run(t, "run", "--gpu", "1", "--", "nvidia-smi")
	if code != 1 || !strings.Contains(errOut, `pool "default" has no GPUs`) || strings.Contains(errOut, "rpc error") {
		t.Errorf("gpu: %d %q", code, errOut)
	}
	_, errOut, code = c.run(t, "run", "--env", "LEVERS9_SECURITY_PROFILE=legacy", "--", "true")
	if code != 1 || !strings.Contains(errOut, "looser") {
		t.Errorf("looser profile: %d %q", code, errOut)
	}
	if ids := c.taskIDs(t, "--state", allStates); len(ids) != 0 {
		t.Fatalf("refused runs left tasks: %v", ids)
	}

	// Ctrl-C cancels the pending task; the stream ends with it.
	r := c.start("run", "--", "sleep", "100")
	var id string
	sdktest.WaitFor(t, "a pending task", func() bool {
		ids := c.taskIDs(t, "--state", "pending")
		if len(ids) == 1 {
			id = ids[0]
		}
		return id != ""
	})
	c.sigs <- syscall.SIGINT
	if code := r.wait(t); code != 1 || !strings.Contains(r.err.String(), "cancelling task "+id) || !strings.Contains(r.err.String(), "task "+id+" was cancelled") {
		t.Errorf("Ctrl-C: %d %q", code, r.err)
	}

	// Two Ctrl-C: the first cancels, the second detaches at once and
	// says how to resume.
	r = c.start("run", "--", "sleep", "100")
	sdktest.WaitFor(t, "a second task", func() bool {
		select {
		case code := <-r.code:
			t.Fatalf("run ended early: %d %q %q", code, r.out, r.err)
		default:
		}
		return len(c.taskIDs(t, "--state", allStates)) == 2
	})
	c.sigs <- syscall.SIGINT
	c.sigs <- syscall.SIGINT
	// A pending task is cancelled at once, so its end may win the race
	// with the second Ctrl-C (TestRunInterrupts pins the detach). The task
	// is listed before the submit's answer reaches the CLI, so both
	// Ctrl-C may also land during the submit: then the CLI gives up
	// waiting, and the task is cancelled here for the counts below.
	code = r.wait(t)
	switch {
	case code == 130 && strings.Contains(r.err.String(), "levers9 task logs -f"):
	case code == 1 && strings.Contains(r.err.String(), "was cancelled"):
	case code == 130 && strings.Contains(r.err.String(), "interrupted while submitting"):
		pending := c.taskIDs(t, "--state", "pending")
		if len(pending) != 1 {
			t.Fatalf("after an abandoned submit: pending %v", pending)
		}
		if _, errOut, code := c.run(t, "task", "cancel", pending[0]); code != 0 {
			t.Fatalf("cancel: %q", errOut)
		}
	default:
		t.Errorf("double Ctrl-C: %d %q", code, r.err)
	}

	out, errOut, code := c.run(t, "run", "--detach", "--memory", "512Mi", "--cpu", "0.25", "--", "echo", "hi")
	detached := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(detached, "t_") {
		t.Fatalf("detach: %q %q", out, errOut)
	}
	out, _, code = c.run(t, "task", "show", detached)
	if code != 0 || !strings.Contains(out, "pending") || !strings.Contains(out, "no attempts yet") ||
		!strings.Contains(out, "512 MiB") || !strings.Contains(out, "0.25 cores") {
		t.Errorf("show: %q", out)
	}
	start := time.Now()
	out, errOut, code = c.run(t, "task", "logs", detached)
	if code != 0 || out != "" || time.Since(start) > 15*time.Second {
		t.Errorf("logs of a pending task: %d %q %q after %s", code, out, errOut, time.Since(start))
	}
	if out, _, code = c.run(t, "task", "cancel", detached); code != 0 || out != "task "+detached+" cancelled\n" {
		t.Errorf("cancel: %q", out)
	}
	out, _, code = c.run(t, "task", "logs", "-f", detached)
	if code != 1 {
		t.Errorf("logs -f of a cancelled task: %d %q", code, out)
	}
	if ids := c.taskIDs(t, "--state", "cancelled"); len(ids) != 3 || ids[0] != detached {
		t.Errorf("cancelled tasks, newest first: %v", ids)
	}
	if _, errOut, code = c.run(t, "task", "show", "t_nope"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("show of a missing task: %q", errOut)
	}
	// Without --state, every task.
	if all, some := c.taskIDs(t), c.taskIDs(t, "--state", allStates); !slices.Equal(all, some) {
		t.Errorf("task list without --state = %v, with every state = %v (controlplane/store ListTasks: a nil states slice reaches SQL as NULL, and cardinality(NULL) = 0 is not true)", all, some)
	}
}

const allStates = "pending,scheduled,running,succeeded,failed,cancelled,timed_out"

// TestInputAndResultScripted: run --input-file gives the task a file's
// bytes (or standard input's), refusing more than 1 MiB before anything
// is submitted; task result prints a finished task's result as raw bytes,
// to stdout or a file, and says why when there is none.
func TestInputAndResultScripted(t *testing.T) {
	t.Parallel()
	srv := sdktest.Start(t)
	c := newTaskCLI(t, srv.Addr, sdktest.Token)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.bin")
	if err := os.WriteFile(in, []byte("hello\x00input"), 0o644); err != nil {
		t.Fatal(err)
	}
	submit := func(t *testing.T, args ...string) string {
		t.Helper()
		out, errOut, code := c.run(t, append([]string{"run", "--detach"}, args...)...)
		if code != 0 {
			t.Fatalf("run %v: %d %q", args, code, errOut)
		}
		return strings.TrimSpace(out)
	}
	id := submit(t, "--input-file", in, "--", "cat")
	if got := srv.Spec(id).Input; string(got) != "hello\x00input" {
		t.Errorf("input from a file: %q", got)
	}
	c.stdin = "from stdin"
	fromStdin := submit(t, "--input-file", "-", "--", "cat")
	c.stdin = ""
	if got := srv.Spec(fromStdin).Input; string(got) != "from stdin" {
		t.Errorf("input from stdin: %q", got)
	}
	big := filepath.Join(dir, "big.bin")
	if err := os.WriteFile(big, make([]byte, 1<<20+1), 0o644); err != nil {
		t.Fatal(err)
	}
	before := srv.Submits()
	for _, file := range []string{big, filepath.Join(dir, "missing")} {
		_, errOut, code := c.run(t, "run", "--input-file", file, "--", "cat")
		if code != 1 || !strings.Contains(errOut, "--input-file") {
			t.Errorf("--input-file %s: %d %q", file, code, errOut)
		}
	}
	if _, errOut, _ := c.run(t, "run", "--input-file", big, "--", "cat"); !strings.Contains(errOut, "more than 1 MiB") {
		t.Errorf("an input too large: %q", errOut)
	}
	if srv.Submits() != before {
		t.Errorf("a refused input was submitted")
	}

	// Not ended yet: says so, and how to wait.
	srv.StartAttempt(id, "m_a")
	_, errOut, code := c.run(t, "task", "result", id)
	if code != 1 || !strings.Contains(errOut, "has not ended") || !strings.Contains(errOut, "levers9 task logs -f "+id) {
		t.Errorf("result of a running task: %d %q", code, errOut)
	}
	raw := []byte("RESULT\x00\xff\n")
	srv.Finish(id, v1.TaskState_TASK_STATE_SUCCEEDED, 0, "")
	srv.SetResult(id, &v1.GetTaskResultResponse{Attempt: 1, Present: true, Result: raw})
	out, errOut, code := c.run(t, "task", "result", id)
	if code != 0 || out != string(raw) || errOut != "" {
		t.Errorf("result: %d %q %q", code, out, errOut)
	}
	file := filepath.Join(dir, "result.bin")
	if out, _, code := c.run(t, "task", "result", id, "-o", file); code != 0 || out != "" {
		t.Errorf("result -o: %d %q", code, out)
	}
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, raw) {
		t.Errorf("the result file: %q, %v", got, err)
	}
	out, _, code = c.run(t, "task", "result", id, "-o", "json")
	var shown struct {
		Attempt int    `json:"attempt"`
		Present bool   `json:"present"`
		Result  []byte `json:"result"`
	}
	if err := json.Unmarshal([]byte(out), &shown); code != 0 || err != nil || !shown.Present || !bytes.Equal(shown.Result, raw) {
		t.Errorf("result -o json: %d %q", code, out)
	}

	srv.StartAttempt(fromStdin, "m_a")
	srv.Finish(fromStdin, v1.TaskState_TASK_STATE_SUCCEEDED, 0, "")
	if _, errOut, code := c.run(t, "task", "result", fromStdin); code != 1 || !strings.Contains(errOut, "wrote no result to /run/levers9/io/result") {
		t.Errorf("no result: %d %q", code, errOut)
	}
	srv.SetResult(fromStdin, &v1.GetTaskResultResponse{Attempt: 2, Error: "the result is 9437184 bytes; the limit is 8 MiB"})
	if _, errOut, code := c.run(t, "task", "result", fromStdin); code != 1 || !strings.Contains(errOut, "(attempt 2) wrote a result that was not kept: the result is 9437184 bytes") {
		t.Errorf("a refused result: %d %q", code, errOut)
	}
	if _, errOut, code := c.run(t, "task", "result", "t_nope"); code != 1 || !strings.Contains(errOut, "no task t_nope") {
		t.Errorf("result of no task: %d %q", code, errOut)
	}
	for _, cmd := range [][]string{{"task", "result", "--help"}, {"run", "--help"}} {
		out, _, code := c.run(t, cmd...)
		if code != 0 || !strings.Contains(out, "/run/levers9/io/result") || !strings.Contains(out, "Examples:") {
			t.Errorf("%v: %q", cmd, out)
		}
	}
}
