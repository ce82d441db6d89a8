package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

type taskResp struct {
	Task taskJSON `json:"task"`
}

func (br *browser) task(id string) taskJSON {
	br.t.Helper()
	var r taskResp
	if code := br.call("GET", "/api/tasks/"+id, nil, &r); code != http.StatusOK {
		br.t.Fatalf("GET task %s: %d", id, code)
	}
	return r.Task
}

func TestTaskListDetailCancelLogs(t *testing.T) {
	b := setup(t, setupOpts{machine: true})
	br := b.signedIn(t, testMember)
	done := b.submit(t, "echo", "alpha", "beta")
	long := b.submit(t, "sleep", "1h")
	controlplanetest.Eventually(t, 20*time.Second, "echo task succeeded and sleep running", func() bool {
		return br.task(done.Id).State == "succeeded" && br.task(long.Id).State == "running"
	})

	t.Run("list with filters", func(t *testing.T) {
		br.t = t
		tests := []struct {
			query string
			want  []string
		}{
			{"", []string{long.Id, done.Id}},
			{"?state=running", []string{long.Id}},
			{"?state=succeeded", []string{done.Id}},
			{"?state=succeeded,running", []string{long.Id, done.Id}},
			{"?state=failed", nil},
			{"?pool=default", []string{long.Id, done.Id}},
			{"?pool=gpu", nil},
			{"?pageSize=1", []string{long.Id}},
		}
		for _, tt := range tests {
			var r struct {
				Tasks         []taskJSON `json:"tasks"`
				NextPageToken string     `json:"nextPageToken"`
			}
			if code := br.call("GET", "/api/tasks"+tt.query, nil, &r); code != http.StatusOK {
				t.Fatalf("%s: %d", tt.query, code)
			}
			var got []string
			for _, x := range r.Tasks {
				got = append(got, x.ID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("GET /api/tasks%s: %v, want %v", tt.query, got, tt.want)
			}
			if tt.query == "?pageSize=1" && r.NextPageToken == "" {
				t.Errorf("first page of one has no nextPageToken")
			}
		}
		var e apiError
		if code := br.call("GET", "/api/tasks?state=sleepy", nil, &e); code != http.StatusBadRequest || !strings.Contains(e.Error.Message, "sleepy") {
			t.Errorf("bad state filter: %d %+v", code, e)
		}
	})

	t.Run("detail with attempts", func(t *testing.T) {
		br.t = t
		d := br.task(done.Id)
		if len(d.Attempts) != 1 || d.Attempts[0].Number != 1 || d.Attempts[0].State != "succeeded" || d.Attempts[0].MachineID != b.machine.ID ||
			d.ExitCode == nil || *d.ExitCode != 0 || d.Image != "busybox:test" || fmt.Sprint(d.Command) != "[echo alpha beta]" {
			t.Errorf("detail: %+v", d)
		}
		var e apiError
		if code := br.call("GET", "/api/tasks/t_nosuchtask", nil, &e); code != http.StatusNotFound || e.Error.Code != "not_found" {
			t.Errorf("missing task: %d %+v", code, e)
		}
	})

	t.Run("logs", func(t *testing.T) {
		br.t = t
		var r struct {
			Events []eventJSON `json:"events"`
			Cursor string      `json:"cursor"`
			More   bool        `json:"more"`
		}
		if code := br.call("GET", "/api/tasks/"+done.Id+"/logs", nil, &r); code != http.StatusOK {
			t.Fatalf("logs: %d", code)
		}
		if got := logLines(r.Events); fmt.Sprint(got) != "[alpha beta]" || r.More {
			t.Errorf("logs: %v (more %v), want [alpha beta]", got, r.More)
		}
		// Paged by cursor: one event at a time covers the same events.
		var all []eventJSON
		cursor := ""
		for i := 0; i < 50; i++ {
			r.Events = nil // fresh events: decoding into old ones would share their pointers
			if code := br.call("GET", "/api/tasks/"+done.Id+"/logs?limit=1&cursor="+url.QueryEscape(cursor), nil, &r); code != http.StatusOK {
				t.Fatalf("logs page: %d", code)
			}
			all = append(all, r.Events...)
			cursor = r.Cursor
			if !r.More {
				break
			}
		}
		if fmt.Sprint(logLines(all)) != "[alpha beta]" {
			t.Errorf("paged logs: %v", logLines(all))
		}
	})

	t.Run("cancel", func(t *testing.T) {
		br.t = t
		var r taskResp
		if code := br.call("POST", "/api/tasks/"+long.Id+"/cancel", nil, &r); code != http.StatusOK {
			t.Fatalf("cancel: %d", code)
		}
		controlplanetest.Eventually(t, 20*time.Second, "task cancelled", func() bool { return br.task(long.Id).State == "cancelled" })
		got, err := v1.NewTaskServiceClient(b.cp.Conn).GetTask(b.admin, &v1.GetTaskRequest{Id: long.Id})
		if err != nil || got.Task.State != v1.TaskState_TASK_STATE_CANCELLED {
			t.Errorf("the controlplane says %v (%v), want cancelled", got.GetTask().GetState(), err)
		}
	})
}

func logLines(evs []eventJSON) []string {
	var out []string
	for _, e := range evs {
		if e.Log != nil {
			out = append(out, e.Log.Text)
		}
	}
	return out
}

// wsMessage is any message of the task WebSocket.
type wsMessage struct {
	eventJSON
	Error *errorBody `json:"error"`
}

func readWS(ctx context.Context, t *testing.T, c *websocket.Conn) (wsMessage, error) {
	t.Helper()
	_, b, err := c.Read(ctx)
	if err != nil {
		return wsMessage{}, err
	}
	var m wsMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("message %q: %v", b, err)
	}
	return m, nil
}

// TestTaskWebSocketLiveAndResume follows a running task's output over the
// WebSocket, drops the socket mid-way, reconnects with the last cursor and
// checks every line arrived once, in order, while the task ran.
func TestTaskWebSocketLiveAndResume(t *testing.T) {
	b := setup(t, setupOpts{machine: true})
	br := b.signedIn(t, testMember)
	const n = 30
	task := b.submit(t, "count", fmt.Sprint(n), "100ms")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var lines []string
	var states []string
	cursor := ""
	ended := false
	var firstLineAt time.Time
	start := time.Now()
	for conn := 0; !ended; conn++ {
		if conn > 3 {
			t.Fatal("more reconnects than planned")
		}
		path := "/api/ws/tasks/" + task.Id
		if cursor != "" {
			path += "?cursor=" + url.QueryEscape(cursor)
		}
		c, code := br.dialWS(ctx, path, nil)
		if c == nil {
			t.Fatalf("dial: %d", code)
		}
		got := 0
		for {
			m, err := readWS(ctx, t, c)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if m.Type == "end" {
				ended = true
				c.Close(websocket.StatusNormalClosure, "")
				break
			}
			if m.Type != "event" {
				t.Fatalf("unexpected message %+v", m)
			}
			cursor = m.Cursor
			if m.Log != nil {
				if firstLineAt.IsZero() {
					firstLineAt = time.Now()
					if st := br.task(task.Id).State; st != "running" {
						t.Errorf("first line arrived while the task was %s, want running (live)", st)
					}
				}
				lines = append(lines, m.Log.Text)
				got++
			}
			if m.State != nil {
				states = append(states, m.State.TaskState)
			}
			// A forced disconnect: the first connection after 5 lines, the
			// second after 10 more, without a close handshake.
			if (conn == 0 && got == 5) || (conn == 1 && got == 10) {
				c.CloseNow()
				break
			}
		}
	}
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("line-%d", i))
	}
	if fmt.Sprint(lines) != fmt.Sprint(want) {
		t.Errorf("lines across reconnects:\n got %v\nwant %v", lines, want)
	}
	if len(states) == 0 || states[len(states)-1] != "succeeded" {
		t.Errorf("states %v, want ending in succeeded", states)
	}
	t.Logf("%d lines over 3 connections; first line %s after the first dial, all in %s", len(lines),
		firstLineAt.Sub(start).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// TestMachineOfflinePushed: the machines WebSocket pushes a machine going
// offline when its agent stops.
func TestMachineOfflinePushed(t *testing.T) {
	b := setup(t, setupOpts{machine: true})
	br := b.signedIn(t, testAdmin)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, code := br.dialWS(ctx, "/api/ws/machines", nil)
	if c == nil {
		t.Fatalf("dial: %d", code)
	}
	defer c.CloseNow()
	var snap struct {
		Type     string        `json:"type"`
		Machines []machineJSON `json:"machines"`
	}
	_, raw, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &snap); err != nil || snap.Type != "snapshot" || len(snap.Machines) != 1 || !snap.Machines[0].Online ||
		snap.Machines[0].ID != b.machine.ID || snap.Machines[0].Inventory == nil || snap.Machines[0].Inventory.CPUs != 4 {
		t.Fatalf("snapshot %s (%v)", raw, err)
	}
	stopped := time.Now()
	b.machine.Stop()
	for {
		_, raw, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("no offline push: %v", err)
		}
		var m struct {
			Type    string      `json:"type"`
			Machine machineJSON `json:"machine"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		if m.Type == "machine" && m.Machine.ID == b.machine.ID && !m.Machine.Online {
			if m.Machine.State != "offline" {
				t.Errorf("state %q, want offline", m.Machine.State)
			}
			t.Logf("offline pushed %s after the agent stopped", time.Since(stopped).Round(time.Millisecond))
			return
		}
	}
}
