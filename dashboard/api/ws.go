package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

const wsWriteTimeout = 10 * time.Second

// accept upgrades a WebSocket after the guard has checked the session and
// role; sess is the guard's, and the socket ends when it expires. Browsers
// send cookies on cross-site WebSocket handshakes, so the Origin must be the
// API's own or the web app's.
func (s *Server) accept(w http.ResponseWriter, r *http.Request, sess *session, view string) (*websocket.Conn, context.Context, func(), bool) {
	var patterns []string
	if u, err := url.Parse(s.cfg.WebURL); err == nil {
		patterns = append(patterns, u.Host)
	}
	if u, err := url.Parse(s.cfg.PublicURL); err == nil {
		patterns = append(patterns, u.Host)
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: patterns})
	if err != nil {
		// Accept has answered the request already.
		return nil, nil, nil, false
	}
	gauge := s.metrics.websockets.WithLabelValues(view)
	gauge.Inc()
	// Reading only serves close frames and pings; the context ends when the
	// browser goes away, and at the latest when its session expires.
	ctx := c.CloseRead(r.Context())
	ctx, cancel := context.WithDeadline(ctx, time.Now().Add(time.Unix(sess.ExpiresAt, 0).Sub(s.clock.Now())))
	return c, ctx, func() {
		cancel()
		gauge.Dec()
		_ = c.CloseNow()
	}, true
}

func wsSend(ctx context.Context, c *websocket.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, wsWriteTimeout)
	defer cancel()
	return c.Write(wctx, websocket.MessageText, b)
}

type wsErrorMsg struct {
	Type  string    `json:"type"` // "error"
	Error errorBody `json:"error"`
}

// closeFor ends a stream: a normal close when the browser left or the
// session ran out (with reason "session expired"), an error message and
// code 1011 otherwise.
func (s *Server) closeFor(ctx context.Context, c *websocket.Conn, view string, err error) {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		_ = c.Close(websocket.StatusPolicyViolation, "session expired")
	case ctx.Err() != nil:
	default:
		st, _ := status.FromError(err)
		code, msg := "unavailable", "the controlplane stream broke; reconnect with the last cursor"
		if st.Code() == codes.NotFound || st.Code() == codes.InvalidArgument {
			code, msg = "not_found", st.Message()
		} else {
			s.log.Warn("WebSocket stream ended", "view", view, "err", err)
		}
		_ = wsSend(ctx, c, wsErrorMsg{Type: "error", Error: errorBody{Code: code, Message: msg}})
		_ = c.Close(websocket.StatusInternalError, code)
	}
}

type wsEndMsg struct {
	Type   string `json:"type"` // "end"
	Cursor string `json:"cursor"`
}

// wsTask: GET /api/ws/tasks/{id}?cursor=C streams the task's events after
// cursor C (all of them without one) as they happen, then {"type":"end"}
// after the terminal state. A browser that lost the socket reconnects with
// the cursor of the last event it handled and gets each event exactly once.
func (s *Server) wsTask(w http.ResponseWriter, r *http.Request, c caller) {
	id, cursor := r.PathValue("id"), r.URL.Query().Get("cursor")
	conn, ctx, done, ok := s.accept(w, r, c.sess, "task")
	if !ok {
		return
	}
	defer done()
	// A controlplane replica going away mid-stream is bridged here: the
	// stream is resumed from the last cursor sent, a few times.
	for retries := 0; ; {
		st, err := s.tasks.FollowTask(s.cp(ctx), &v1.FollowTaskRequest{Id: id, Cursor: cursor})
		for err == nil {
			var ev *v1.TaskEvent
			if ev, err = st.Recv(); err != nil {
				break
			}
			if err = wsSend(ctx, conn, eventView(ev)); err != nil {
				return
			}
			cursor, retries = ev.Cursor, 0
		}
		if errors.Is(err, io.EOF) {
			_ = wsSend(ctx, conn, wsEndMsg{Type: "end", Cursor: cursor})
			_ = conn.Close(websocket.StatusNormalClosure, "task finished")
			return
		}
		if status.Code(err) == codes.Unavailable && ctx.Err() == nil && retries < 5 {
			retries++
			select {
			case <-time.After(time.Duration(retries) * 200 * time.Millisecond):
				continue
			case <-ctx.Done():
			}
		}
		s.closeFor(ctx, conn, "task", err)
		return
	}
}

// poll runs fetch every PollInterval and sends what changed: first a
// snapshot, then one message per item whose JSON changed, and "removed"
// for items gone. fetch returns the items (their JSON views) and their IDs.
func (s *Server) poll(ctx context.Context, c *websocket.Conn, snapshotField, itemType string, fetch func(context.Context) ([]any, []string, error)) error {
	var last map[string][]byte
	t := time.NewTicker(s.cfg.PollInterval)
	defer t.Stop()
	for {
		items, ids, err := fetch(s.cp(ctx))
		if err != nil {
			return err
		}
		cur := make(map[string][]byte, len(items))
		for i, it := range items {
			b, err := json.Marshal(it)
			if err != nil {
				return err
			}
			cur[ids[i]] = b
		}
		if last == nil {
			if err := wsSend(ctx, c, map[string]any{"type": "snapshot", snapshotField: items}); err != nil {
				return err
			}
		} else {
			for i, id := range ids {
				if !bytes.Equal(last[id], cur[id]) {
					if err := wsSend(ctx, c, map[string]any{"type": itemType, itemType: items[i]}); err != nil {
						return err
					}
				}
			}
			for id := range last {
				if _, ok := cur[id]; !ok {
					if err := wsSend(ctx, c, map[string]any{"type": "removed", "id": id}); err != nil {
						return err
					}
				}
			}
		}
		last = cur
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// wsMachines: GET /api/ws/machines?pool=P pushes machines going online
// and offline (and any other change but heartbeats).
func (s *Server) wsMachines(w http.ResponseWriter, r *http.Request, c caller) {
	pool := r.URL.Query().Get("pool")
	conn, ctx, done, ok := s.accept(w, r, c.sess, "machines")
	if !ok {
		return
	}
	defer done()
	err := s.poll(ctx, conn, "machines", "machine", func(ctx context.Context) ([]any, []string, error) {
		resp, err := s.machines.ListMachines(ctx, &v1.ListMachinesRequest{Pool: pool})
		if err != nil {
			return nil, nil, err
		}
		items, ids := make([]any, 0, len(resp.Machines)), make([]string, 0, len(resp.Machines))
		for _, m := range resp.Machines {
			mv := machineView(m)
			// Heartbeats tick every few seconds; they are not news.
			mv.LastHeartbeat = nil
			items, ids = append(items, mv), append(ids, m.Id)
		}
		return items, ids, nil
	})
	s.closeFor(ctx, conn, "machines", err)
}

// wsTasks: GET /api/ws/tasks?state=running&pool=P pushes the newest 50
// matching tasks, then each one whose state or attempts change.
func (s *Server) wsTasks(w http.ResponseWriter, r *http.Request, c caller) {
	q := r.URL.Query()
	states, ok := parseStates(w, q["state"])
	if !ok {
		return
	}
	pool := q.Get("pool")
	conn, ctx, done, ok := s.accept(w, r, c.sess, "tasks")
	if !ok {
		return
	}
	defer done()
	err := s.poll(ctx, conn, "tasks", "task", func(ctx context.Context) ([]any, []string, error) {
		resp, err := s.tasks.ListTasks(ctx, &v1.ListTasksRequest{PageSize: 50, States: states})
		if err != nil {
			return nil, nil, err
		}
		var items []any
		var ids []string
		for _, t := range resp.Tasks {
			if matchesPool(t, pool) {
				items, ids = append(items, taskView(t)), append(ids, t.Id)
			}
		}
		if items == nil {
			items = []any{}
		}
		return items, ids, nil
	})
	s.closeFor(ctx, conn, "tasks", err)
}
