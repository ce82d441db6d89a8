package tasks_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// bigAnswer lets a test's client take an answer carrying the largest
// result (gRPC's default stops at 4 MiB).
var bigAnswer = grpc.MaxCallRecvMsgSize(16 << 20)

// TestTaskInputAndResult is the result channel through the real task API
// and a machine at the tunnel boundary: the input reaches the attempt and
// is left out of every task the API returns; GetTaskResult is NotFound for
// a task of no one's and for one that has not ended, then gives what the
// attempt left (an uppercased input, nothing, a refusal, the largest
// result over gRPC and REST); an input over 1 MiB is refused naming the
// field.
func TestTaskInputAndResult(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	m := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 4, 0)
	other := secondWorkspace(t, b)
	result := func(t *testing.T, b *bundle, id string) (*v1.GetTaskResultResponse, error) {
		t.Helper()
		return b.tasks.GetTaskResult(b.ctx, &v1.GetTaskResultRequest{Id: id}, bigAnswer)
	}

	input := bytes.Repeat([]byte("pickled call "), 1000)
	task := b.submit(t, &v1.TaskSpec{Command: []string{"upper", "1s"}, Input: input}, "")
	if len(task.Spec.Input) != 0 {
		t.Errorf("SubmitTask's answer carries %d bytes of input", len(task.Spec.Input))
	}
	waitState(t, b, task.Id, v1.TaskState_TASK_STATE_RUNNING)
	if _, err := result(t, b, task.Id); status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "has not ended") {
		t.Errorf("result of a running task: %v, want NotFound saying it has not ended", err)
	}
	done := waitState(t, b, task.Id, v1.TaskState_TASK_STATE_SUCCEEDED)
	if len(done.Spec.Input) != 0 {
		t.Errorf("GetTask carries %d bytes of input", len(done.Spec.Input))
	}
	list, err := b.tasks.ListTasks(b.ctx, &v1.ListTasksRequest{})
	if err != nil || len(list.Tasks) != 1 || len(list.Tasks[0].Spec.Input) != 0 {
		t.Errorf("ListTasks: %v (input shown?)", err)
	}
	if got := m.Attempts(); len(got) != 1 || !bytes.Equal(got[0].Input, input) {
		t.Fatalf("the attempt pushed did not carry the input")
	}
	r, err := result(t, b, task.Id)
	if err != nil || r.Attempt != 1 || !r.Present || !bytes.Equal(r.Result, bytes.ToUpper(input)) || r.Error != "" {
		t.Fatalf("GetTaskResult = attempt %d present %v, %d bytes, %q, %v", r.GetAttempt(), r.GetPresent(), len(r.GetResult()), r.GetError(), err)
	}
	for _, tc := range []struct {
		name string
		b    *bundle
		id   string
	}{{"no such task", b, "t_nope"}, {"another workspace's", other, task.Id}} {
		_, err := result(t, tc.b, tc.id)
		if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "no task "+tc.id) {
			t.Errorf("%s: %v, want NotFound", tc.name, err)
		}
	}

	for _, tc := range []struct {
		name    string
		command []string
		want    []byte
		wantErr string
	}{
		{"none written", []string{"echo", "x"}, nil, ""},
		{"refused by the agent", []string{"result-refused"}, nil, "the limit is 8 MiB"},
		{"the largest", []string{"result", "8388608"}, bytes.Repeat([]byte("r"), 8<<20), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := b.submit(t, &v1.TaskSpec{Command: tc.command}, "")
			waitState(t, b, tk.Id, v1.TaskState_TASK_STATE_SUCCEEDED)
			r, err := result(t, b, tk.Id)
			if err != nil || r.Attempt != 1 || r.Present != (tc.want != nil) || !bytes.Equal(r.Result, tc.want) || !strings.Contains(r.Error, tc.wantErr) {
				t.Fatalf("GetTaskResult = attempt %d present %v, %d bytes, %q, %v", r.GetAttempt(), r.GetPresent(), len(r.GetResult()), r.GetError(), err)
			}
			if tc.want == nil {
				return
			}
			// Over REST too: the gateway takes an answer of that size.
			md, _ := metadata.FromOutgoingContext(b.ctx)
			req, _ := http.NewRequest("GET", "http://"+b.in.Server.RESTAddr()+"/api/v1/tasks/"+tk.Id+"/result", nil)
			req.Header.Set("Authorization", md.Get("authorization")[0])
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			var got struct {
				Attempt int    `json:"attempt"`
				Present bool   `json:"present"`
				Result  []byte `json:"result"`
			}
			if err := json.Unmarshal(body, &got); resp.StatusCode != http.StatusOK || err != nil || !got.Present || !bytes.Equal(got.Result, tc.want) {
				t.Fatalf("REST result: %d, %v, present %v, %d bytes: %.200s", resp.StatusCode, err, got.Present, len(got.Result), body)
			}
		})
	}

	t.Run("cancelled before it was placed", func(t *testing.T) {
		// The other workspace has no machine: its task waits.
		tk := other.submit(t, &v1.TaskSpec{Command: []string{"echo"}, Input: []byte("x")}, "")
		if _, err := other.tasks.CancelTask(other.ctx, &v1.CancelTaskRequest{Id: tk.Id}); err != nil {
			t.Fatal(err)
		}
		r, err := result(t, other, tk.Id)
		if err != nil || r.Attempt != 0 || r.Present {
			t.Fatalf("GetTaskResult = %v, %v; want attempt 0 and no result", r, err)
		}
	})

	t.Run("an input over 1 MiB", func(t *testing.T) {
		_, err := b.tasks.SubmitTask(b.ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: []string{"echo"}, Input: make([]byte, 1<<20+1)}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "input: 1048577 bytes, more than the 1 MiB") {
			t.Fatalf("submit: %v, want InvalidArgument naming input", err)
		}
		tk := b.submit(t, &v1.TaskSpec{Command: []string{"upper"}, Input: make([]byte, 1<<20)}, "")
		waitState(t, b, tk.Id, v1.TaskState_TASK_STATE_SUCCEEDED)
		if r, err := result(t, b, tk.Id); err != nil || len(r.Result) != 1<<20 {
			t.Fatalf("a 1 MiB input: %d bytes back, %v", len(r.GetResult()), err)
		}
	})
}

// TestTaskResultOfTheLastAttempt: a task whose first machine is lost runs
// again elsewhere, and its result is the second attempt's, which got the
// input too.
func TestTaskResultOfTheLastAttempt(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	first := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	// As in TestLostAgentRetriesElsewhere: the attempt must not end on the
	// first machine before it stops (1 s once did, in a loaded CI run).
	task := b.submit(t, &v1.TaskSpec{Command: []string{"upper", "3s"}, Input: []byte("again"), Retries: 1}, "")
	waitState(t, b, task.Id, v1.TaskState_TASK_STATE_RUNNING)
	first.Stop()
	second := controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	done := waitState(t, b, task.Id, v1.TaskState_TASK_STATE_SUCCEEDED)
	if len(done.Attempts) != 2 || done.Attempts[0].State != v1.AttemptState_ATTEMPT_STATE_LOST {
		t.Fatalf("attempts: %v", done.Attempts)
	}
	if a := second.Attempts(); len(a) != 1 || string(a[0].Input) != "again" {
		t.Fatalf("the second attempt's push: %v", a)
	}
	r, err := b.tasks.GetTaskResult(b.ctx, &v1.GetTaskResultRequest{Id: task.Id})
	if err != nil || r.Attempt != 2 || !r.Present || string(r.Result) != "AGAIN" {
		t.Fatalf("GetTaskResult = %v, %v; want attempt 2's", r, err)
	}
}
