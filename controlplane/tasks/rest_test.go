package tasks_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// The task API over REST: submit, get, and follow as a stream of JSON
// lines, with the same token and the same answers as gRPC.
func TestTasksOverREST(t *testing.T) {
	t.Parallel()
	b := start(t, config1s(t))
	controlplanetest.StartScriptedMachine(t, b.in, b.ctx, "default", 2, 0)
	md, _ := metadata.FromOutgoingContext(b.ctx)
	auth := md.Get("authorization")[0]
	call := func(method, path, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+b.in.Server.RESTAddr()+path, strings.NewReader(body))
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	code, body := call("POST", "/api/v1/tasks", `{"spec": {"command": ["echo", "over", "rest"]}, "idempotencyKey": "rest-1"}`)
	var sub struct {
		Task struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"task"`
	}
	if err := json.Unmarshal(body, &sub); code != http.StatusOK || err != nil || sub.Task.ID == "" {
		t.Fatalf("submit: %d %s", code, body)
	}
	if code, body := call("POST", "/api/v1/tasks", `{"spec": {"gpus": 1}}`); code != http.StatusBadRequest || !strings.Contains(string(body), "has no GPUs") {
		t.Errorf("GPU on a pool without: %d %s", code, body)
	}
	// Follow: one JSON object per line, {"result": TaskEvent}, to the end.
	req, _ := http.NewRequest("GET", "http://"+b.in.Server.RESTAddr()+"/api/v1/tasks/"+sub.Task.ID+"/events", nil)
	req.Header.Set("Authorization", auth)
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev struct {
			Result struct {
				Log *struct {
					Text string `json:"text"`
				} `json:"log"`
				State *struct {
					TaskState string `json:"taskState"`
				} `json:"state"`
			} `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event line %q: %v", sc.Text(), err)
		}
		if ev.Result.Log != nil {
			lines = append(lines, ev.Result.Log.Text)
		}
		if ev.Result.State != nil && ev.Result.State.TaskState == "TASK_STATE_SUCCEEDED" {
			lines = append(lines, "SUCCEEDED")
		}
	}
	if got := strings.Join(lines, " "); got != "over rest SUCCEEDED" {
		t.Errorf("followed over REST: %q", got)
	}
	if code, body := call("GET", "/api/v1/tasks/"+sub.Task.ID, ""); code != http.StatusOK || !strings.Contains(string(body), `"TASK_STATE_SUCCEEDED"`) {
		t.Errorf("get: %d %s", code, body)
	}
	if code, _ := call("GET", "/api/v1/tasks/t_nope", ""); code != http.StatusNotFound {
		t.Errorf("get of a missing task: %d", code)
	}
}
