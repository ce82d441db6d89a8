package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sdk/sdktest"
)

// scripted starts a scripted TaskService and a client of it.
func scripted(t *testing.T, extra map[string]string, opts ...Option) (*sdktest.Server, *Client) {
	t.Helper()
	srv := sdktest.Start(t)
	env := map[string]string{"LEVERS9_CONTROLPLANE": srv.Addr, "LEVERS9_TOKEN": sdktest.Token, "LEVERS9_HOME": t.TempDir()}
	for k, v := range extra {
		env[k] = v
	}
	opts = append([]Option{WithGetenv(func(k string) string { return env[k] }), withBackoffForTest(5 * time.Millisecond)}, opts...)
	c, err := NewClient(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c
}

func TestNewClientFromContextFile(t *testing.T) {
	t.Parallel()
	srv := sdktest.Start(t)
	home := t.TempDir()
	cfg := fmt.Sprintf("current = \"a\"\n[contexts.a]\ncontrolplane = %q\ntoken = %q\n[contexts.b]\ncontrolplane = \"127.0.0.1:1\"\n", srv.Addr, sdktest.Token)
	if err := os.WriteFile(filepath.Join(home, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		env     map[string]string
		opts    []Option
		wantErr string
	}{
		{name: "current context", env: map[string]string{}},
		{name: "context without token", env: map[string]string{"LEVERS9_CONTEXT": "b"}, wantErr: "has no token"},
		{name: "context option", opts: []Option{WithContext("nope")}, wantErr: `no context "nope"`},
		{name: "token from env", env: map[string]string{"LEVERS9_CONTEXT": "b", "LEVERS9_TOKEN": "x"}},
		{name: "no config", env: map[string]string{"LEVERS9_HOME": t.TempDir()}, wantErr: "LEVERS9_CONTROLPLANE"},
		{name: "bad tls env", env: map[string]string{"LEVERS9_CONTROLPLANE": "127.0.0.1:5", "LEVERS9_TOKEN": "x", "LEVERS9_CONTROLPLANE_TLS": "maybe"}, wantErr: "not true or false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"LEVERS9_HOME": home}
			for k, v := range tt.env {
				env[k] = v
			}
			c, err := NewClient(context.Background(), append(tt.opts, WithGetenv(func(k string) string { return env[k] }))...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if strings.Contains(fmt.Sprint(err), sdktest.Token) {
				t.Error("token in an error")
			}
		})
	}
	// The current context reaches the server with its token.
	c, err := NewClient(context.Background(), WithGetenv(func(k string) string { return map[string]string{"LEVERS9_HOME": home}[k] }))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Function("f").Submit(context.Background(), "true"); err != nil {
		t.Fatalf("submit through the context file: %v", err)
	}
}

func TestFunctionSpec(t *testing.T) {
	t.Parallel()
	_, c := scripted(t, map[string]string{"LEVERS9_SECCOMP": "enforce", "LEVERS9_SECURITY_PROFILE": "hardened"})
	tests := []struct {
		name    string
		opts    []FunctionOption
		args    []string
		check   func(*v1.TaskSpec) bool
		wantErr []string
	}{
		{name: "command and args", opts: []FunctionOption{Command("python", "-c")}, args: []string{"print(1)"},
			check: func(s *v1.TaskSpec) bool { return slices.Equal(s.Command, []string{"python", "-c", "print(1)"}) }},
		{name: "resources", opts: []FunctionOption{CPU(0.25), Memory(512 * MiB), GPU(2, "A100"), Pool("gpu"), Image("reg/x:1"), Retries(3), Timeout(time.Minute)},
			check: func(s *v1.TaskSpec) bool {
				return s.CpuMillis == 250 && s.MemoryBytes == 512<<20 && s.Gpus == 2 && s.GpuType == "A100" && s.Pool == "gpu" &&
					s.Image == "reg/x:1" && s.Retries == 3 && s.Timeout.AsDuration() == time.Minute
			}},
		{name: "security env passes through", opts: []FunctionOption{Env("A", "1")},
			check: func(s *v1.TaskSpec) bool {
				return s.Env["A"] == "1" && s.Env["LEVERS9_SECCOMP"] == "enforce" && s.Env["LEVERS9_SECURITY_PROFILE"] == "hardened"
			}},
		{name: "explicit security env wins", opts: []FunctionOption{Env("LEVERS9_SECCOMP", "log")},
			check: func(s *v1.TaskSpec) bool { return s.Env["LEVERS9_SECCOMP"] == "log" }},
		{name: "every problem at once",
			opts:    []FunctionOption{GPU(-1, ""), CPU(0), Memory(10), Retries(-2), Timeout(-time.Second), Env("1BAD", "x"), MaxOutput(0)},
			wantErr: []string{"GPU", "CPU", "Memory", "Retries", "Timeout", `"1BAD"`, "MaxOutput"}},
		{name: "gpu type without count", opts: []FunctionOption{GPU(0, "A100")}, wantErr: []string{"without a GPU count"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := c.Function("f", tt.opts...).Spec(tt.args...)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatal("no error")
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil || !tt.check(spec) {
				t.Fatalf("spec = %v, err = %v", spec, err)
			}
		})
	}
	// A call's args never leak into the function's own spec.
	fn := c.Function("f", Command("echo"), Env("K", "v"))
	s1, _ := fn.Spec("a")
	s1.Env["K"] = "changed"
	s2, _ := fn.Spec("b")
	if !slices.Equal(s2.Command, []string{"echo", "b"}) || s2.Env["K"] != "v" {
		t.Errorf("spec shares state between calls: %v", s2)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, name := range []string{"", "train", strings.Repeat("x", 300), "héllo wörld/../"} {
		k := NewIdempotencyKey(name)
		if len(k) > 128 || seen[k] || strings.ContainsAny(k, " /é") {
			t.Errorf("key %q for %q", k, name)
		}
		seen[k] = true
	}
}

func TestTail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		max       int
		lines     []string
		want      string
		truncated bool
	}{
		{10, []string{"a", "b"}, "a\nb\n", false},
		{4, []string{"a", "b"}, "a\nb\n", false},
		{4, []string{"a", "b", "c"}, "b\nc\n", true},
		{4, []string{"abcdefg"}, "efg\n", true},
		{5, []string{"ab", "cd", "e"}, "cd\ne\n", true},
	}
	for _, tt := range tests {
		tl := newTail(tt.max)
		for _, l := range tt.lines {
			tl.add(l)
		}
		if tl.String() != tt.want || tl.truncated != tt.truncated || len(tl.String()) > tt.max {
			t.Errorf("tail(%d, %q) = %q, %v; want %q, %v", tt.max, tt.lines, tl.String(), tl.truncated, tt.want, tt.truncated)
		}
	}
}

func TestErrorOf(t *testing.T) {
	t.Parallel()
	lost := &v1.Attempt{Number: 2, State: v1.AttemptState_ATTEMPT_STATE_LOST, Message: "tunnel gone"}
	tests := []struct {
		task *v1.Task
		want string // "" for no error
	}{
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_SUCCEEDED}, ""},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, ExitCode: proto.Int32(3)}, "task t1 exited with code 3"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_CANCELLED}, "task t1 was cancelled"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_TIMED_OUT, Spec: &v1.TaskSpec{Timeout: durationpb.New(time.Minute)}}, "task t1 timed out after 1m0s"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, Attempts: []*v1.Attempt{{Number: 1}, lost}},
			"task t1 lost its machine on attempt 2 with no retries left: tunnel gone"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, Message: "image x not found"}, "task t1 failed: image x not found"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, Message: "prestart image: pull image r/x:1: ...: MANIFEST_UNKNOWN",
			Attempts: []*v1.Attempt{{Number: 1, MachineId: "m_y", State: v1.AttemptState_ATTEMPT_STATE_FAILED, Message: "the chain",
				Reason: v1.FailureReason_FAILURE_REASON_IMAGE_NOT_FOUND, Summary: "image r/x:1 was not found (check the name and tag)"}}},
			"task t1 could not start on machine m_y: image r/x:1 was not found (check the name and tag)"},
		{&v1.Task{Id: "t1", State: v1.TaskState_TASK_STATE_FAILED, ExitCode: proto.Int32(137),
			Attempts: []*v1.Attempt{{Number: 1, MachineId: "m_y", State: v1.AttemptState_ATTEMPT_STATE_FAILED, ExitCode: proto.Int32(137),
				Reason: v1.FailureReason_FAILURE_REASON_OUT_OF_MEMORY, Summary: "out of memory: limit 64 MiB"}}},
			"task t1 was killed on machine m_y (exit code 137): out of memory: limit 64 MiB"},
	}
	for _, tt := range tests {
		err := ErrorOf(tt.task)
		if (err == nil) != (tt.want == "") || (err != nil && err.Error() != tt.want) {
			t.Errorf("ErrorOf(%v) = %v, want %q", tt.task, err, tt.want)
		}
	}
}

func TestMapOrderAndBound(t *testing.T) {
	t.Parallel()
	var running, peak atomic.Int32
	inputs := make([][]string, 40)
	for i := range inputs {
		inputs[i] = []string{fmt.Sprint(i)}
	}
	call := func(ctx context.Context, args ...string) (*Result, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		// Later inputs finish first, so order comes from the indexes: the
		// fake call's duration is the scenario.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(40-len(args[0])) * time.Millisecond / 4):
		}
		if args[0] == "7" {
			return &Result{Stdout: "7\n"}, errors.New("seven failed")
		}
		return &Result{Stdout: args[0] + "\n"}, nil
	}
	for _, n := range []int{1, 3, 8} {
		peak.Store(0)
		res, errs := mapOrdered(context.Background(), inputs, n, call)
		if int(peak.Load()) > n || (n > 1 && peak.Load() < 2) {
			t.Errorf("concurrency %d: peak %d", n, peak.Load())
		}
		for i := range inputs {
			if res[i] == nil || res[i].Stdout != fmt.Sprint(i)+"\n" {
				t.Fatalf("concurrency %d: result %d = %v", n, i, res[i])
			}
			if (errs[i] != nil) != (i == 7) {
				t.Errorf("concurrency %d: err %d = %v", n, i, errs[i])
			}
		}
	}
	// A cancelled context: inputs not started are not run.
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	res, errs := mapOrdered(ctx, inputs, 2, func(ctx context.Context, args ...string) (*Result, error) {
		if calls.Add(1) == 2 {
			cancel()
		}
		return &Result{}, ctx.Err()
	})
	if calls.Load() > 3 || !errors.Is(errs[len(errs)-1], context.Canceled) || res[len(res)-1] != nil {
		t.Errorf("after cancel: %d calls, last err %v", calls.Load(), errs[len(errs)-1])
	}
}

// Secret names workspace secrets by name only, once each; a name the
// controlplane could never hold is refused before anything is sent.
func TestFunctionSecret(t *testing.T) {
	t.Parallel()
	_, c := scripted(t, nil)
	spec, err := c.Function("f", Secret("db"), Secret("api-keys"), Secret("db")).Spec("run")
	if err != nil || !slices.Equal(spec.Secrets, []string{"db", "api-keys"}) || len(spec.Env) != 0 {
		t.Fatalf("spec %v, err %v", spec, err)
	}
	if _, err := c.Function("f", Secret("no spaces")).Spec(); err == nil || !strings.Contains(err.Error(), `Secret: "no spaces"`) {
		t.Fatalf("want the bad name refused: %v", err)
	}
}

// TestInputAndTaskResult: Input puts bytes in the spec (more than
// MaxInputBytes is a problem of the function), and TaskResult returns a
// finished task's result, larger than gRPC's default message limit, and
// NotFound for one that has not ended.
func TestInputAndTaskResult(t *testing.T) {
	t.Parallel()
	srv, c := scripted(t, nil)
	ctx := context.Background()
	if _, err := c.Function("f", Input(make([]byte, MaxInputBytes+1))).Spec(); err == nil || !strings.Contains(err.Error(), "Input:") {
		t.Errorf("an input over the limit: %v", err)
	}
	task, err := c.Function("f", Input([]byte("in"))).Submit(ctx, "cat")
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.Spec(task.Id).Input; string(got) != "in" {
		t.Errorf("submitted input %q", got)
	}
	srv.StartAttempt(task.Id, "m_a")
	if _, err := c.TaskResult(ctx, task.Id); status.Code(err) != codes.NotFound {
		t.Errorf("result of a running task: %v, want NotFound", err)
	}
	big := bytes.Repeat([]byte{1}, 8<<20)
	srv.Finish(task.Id, v1.TaskState_TASK_STATE_SUCCEEDED, 0, "")
	srv.SetResult(task.Id, &v1.GetTaskResultResponse{Attempt: 1, Present: true, Result: big})
	r, err := c.TaskResult(ctx, task.Id)
	if err != nil || !r.Present || !bytes.Equal(r.Result, big) {
		t.Fatalf("TaskResult: %d bytes, %v", len(r.GetResult()), err)
	}
}
