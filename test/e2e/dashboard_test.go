package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/dashboard/api"
	"github.com/levers9/levers9/internal/clientconfig"
	"github.com/levers9/levers9/internal/testenv"
)

// TestDashboardWithRealAgents puts the dashboard API in front of the whole
// stack (two machines running the real agent and runc): a task's output
// arrives live over the WebSocket and resumes across forced disconnects
// with no line missed or doubled, and a machine whose agent stops is
// pushed as offline.
func TestDashboardWithRealAgents(t *testing.T) {
	w := setupTaskWorld(t)
	f, err := clientconfig.LoadFile(w.home)
	if err != nil {
		t.Fatal(err)
	}
	token := f.Contexts["e2e"].Token
	cfg := &api.Config{Addr: "127.0.0.1:0", Controlplane: w.in.Server.GRPCAddr(), ControlplaneTLS: true, ControlplaneCA: w.cert,
		Token: token, SessionSecret: "e2e-dashboard-session-secret-0123456789", DevSignIn: true, Admins: []string{"@localhost"},
		PollInterval: 200 * time.Millisecond}
	cfg.WithDefaults()
	srv, err := api.New(cfg, api.Options{Logger: slog.New(slog.NewTextHandler(testenv.LogWriter(t, "DASHBOARD_LOG"), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	base := "http://" + srv.Addr()

	// Development sign-in, as the web app does it.
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	var sess struct {
		CSRFToken string `json:"csrfToken"`
		Role      string `json:"role"`
	}
	getJSON := func(method, path, csrf, body string, out any) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if csrf != "" {
			req.Header.Set("X-CSRF-Token", csrf)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatal(err)
		}
	}
	getJSON("GET", "/api/session", "", "", &sess)
	getJSON("POST", "/api/auth/dev", sess.CSRFToken, `{"email":"ops@localhost"}`, &sess)
	if sess.Role != "admin" {
		t.Fatalf("signed in as %q, want admin", sess.Role)
	}
	ws := func(ctx context.Context, path string) *websocket.Conn {
		t.Helper()
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+path, &websocket.DialOptions{HTTPClient: hc})
		if err != nil {
			t.Fatalf("dial %s: %v", path, err)
		}
		c.SetReadLimit(1 << 20)
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t.Run("live log lines resume across disconnects", func(t *testing.T) {
		admin := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
		const n = 40
		sub, err := v1.NewTaskServiceClient(w.in.Conn).SubmitTask(admin, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{
			Command: []string{"sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do echo line-$i; i=$((i+1)); sleep 0.1; done", n)}}})
		if err != nil {
			t.Fatal(err)
		}
		id := sub.Task.Id
		var lines []string
		cursor, ended, sawRunning := "", false, false
		start := time.Now()
		var first time.Duration
		for conn := 0; !ended; conn++ {
			if conn > 3 {
				t.Fatal("more reconnects than planned")
			}
			path := "/api/ws/tasks/" + id
			if cursor != "" {
				path += "?cursor=" + url.QueryEscape(cursor)
			}
			c := ws(ctx, path)
			got := 0
			for {
				_, b, err := c.Read(ctx)
				if err != nil {
					t.Fatalf("read: %v (lines so far %v)", err, lines)
				}
				var m struct {
					Type   string `json:"type"`
					Cursor string `json:"cursor"`
					Log    *struct {
						Text string `json:"text"`
					} `json:"log"`
					State *struct {
						TaskState string `json:"taskState"`
					} `json:"state"`
				}
				if err := json.Unmarshal(b, &m); err != nil {
					t.Fatal(err)
				}
				if m.Type == "end" {
					ended = true
					c.Close(websocket.StatusNormalClosure, "")
					break
				}
				cursor = m.Cursor
				if m.State != nil && m.State.TaskState == "running" {
					sawRunning = true
				}
				if m.Log != nil {
					if first == 0 {
						first = time.Since(start)
					}
					lines = append(lines, m.Log.Text)
					got++
				}
				if (conn == 0 && got == 7) || (conn == 1 && got == 13) {
					c.CloseNow()
					break
				}
			}
		}
		var want []string
		for i := range n {
			want = append(want, fmt.Sprintf("line-%d", i))
		}
		if fmt.Sprint(lines) != fmt.Sprint(want) || !sawRunning {
			t.Errorf("lines across reconnects (running seen: %v):\n got %v\nwant %v", sawRunning, lines, want)
		}
		t.Logf("%d lines over 3 connections; first line %s after submit, all in %s", len(lines), first.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	})

	t.Run("machine offline pushed when its agent stops", func(t *testing.T) {
		c := ws(ctx, "/api/ws/machines")
		defer c.CloseNow()
		type machine struct {
			ID     string `json:"id"`
			Online bool   `json:"online"`
			State  string `json:"state"`
		}
		var snap struct {
			Type     string    `json:"type"`
			Machines []machine `json:"machines"`
		}
		_, b, err := c.Read(ctx)
		if err != nil || json.Unmarshal(b, &snap) != nil || snap.Type != "snapshot" || len(snap.Machines) != 2 || !snap.Machines[0].Online {
			t.Fatalf("snapshot %s (%v)", b, err)
		}
		victim := snap.Machines[0].ID
		stopped := time.Now()
		stopAgent(t, victim)
		for {
			_, b, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("no offline push for %s: %v", victim, err)
			}
			var m struct {
				Type    string  `json:"type"`
				Machine machine `json:"machine"`
			}
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			if m.Type == "machine" && m.Machine.ID == victim && !m.Machine.Online {
				if m.Machine.State != "offline" {
					t.Errorf("state %q, want offline", m.Machine.State)
				}
				t.Logf("offline pushed %s after SIGTERM to the agent", time.Since(stopped).Round(time.Millisecond))
				return
			}
		}
	})
}

// stopAgent sends SIGTERM to the agent of machineID, the way a service
// manager stops it.
func stopAgent(t *testing.T, machineID string) {
	t.Helper()
	if err := syscall.Kill(agentPID(t, machineID), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}
