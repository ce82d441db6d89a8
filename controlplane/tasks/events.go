package tasks

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/internal/errdefs"
)

// Events owns each task's event stream: a Redis stream (bus.TaskEventsKey)
// whose entry IDs are follow cursors. Agent records are appended with their
// sequence number checked against the attempt's acknowledged number in the
// same script, so a resent batch never duplicates lines; controlplane
// events (state changes) are appended as they happen. A growth is announced
// on bus.TaskEventsChannel, and the one subscription per replica that Start
// opens wakes the followers here. Publish and Follow work before Start too
// (followers then notice growth by polling only).
type Events struct {
	d    *deps
	life lifecycle

	// mu guards watchers.
	mu       sync.Mutex
	watchers map[string]map[chan struct{}]bool // task ID -> followers here
}

func newEvents(d *deps) *Events {
	return &Events{d: d, life: lifecycle{name: "events"}, watchers: map[string]map[chan struct{}]bool{}}
}

// Start subscribes to the growth announcements until Stop.
func (e *Events) Start(ctx context.Context) error {
	if _, err := e.life.begin(ctx); err != nil {
		return err
	}
	e.life.goRun(func(ctx context.Context) {
		bus.Deliver(ctx, e.d.redis.Subscribe(ctx, bus.TaskEventsChannel), func(m *redis.Message) { e.grew(m.Payload) })
	})
	return nil
}

// Stop ends the subscription and waits for it.
func (e *Events) Stop() { e.life.stop() }

var appendScript = redis.NewScript(`
local acked = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local first = tonumber(ARGV[2])
local n = #ARGV - 5
local added = 0
for i = 1, n do
  if first + i - 1 > acked then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[5 + i])
    added = added + 1
  end
end
local last = first + n - 1
if last > acked then
  redis.call('HSET', KEYS[2], ARGV[1], last)
  acked = last
end
if added > 0 then
  redis.call('PUBLISH', ARGV[5], ARGV[4])
end
return acked
`)

// appendRecords appends encoded events numbered first.. for an attempt,
// skipping numbers already stored, and returns the acknowledged number.
func (e *Events) appendRecords(ctx context.Context, taskID string, attempt int, first uint64, events [][]byte) (uint64, error) {
	args := make([]any, 0, 5+len(events))
	args = append(args, attempt, first, bus.TaskEventsMaxLen, taskID, bus.TaskEventsChannel)
	for _, ev := range events {
		args = append(args, ev)
	}
	acked, err := appendScript.Run(ctx, e.d.redis, []string{bus.TaskEventsKey(taskID), bus.TaskAcksKey(taskID)}, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("append events of task %s: %w: %w", taskID, errdefs.ErrUnavailable, err)
	}
	return uint64(acked), nil
}

// acked is the last record of an attempt stored so far.
func (e *Events) acked(ctx context.Context, taskID string, attempt int) uint64 {
	n, _ := e.d.redis.HGet(ctx, bus.TaskAcksKey(taskID), fmt.Sprint(attempt)).Uint64()
	return n
}

// Publish appends a controlplane event (no sequence number). A failure is
// logged, not returned: followers fall back to the task's row.
func (e *Events) Publish(ctx context.Context, taskID string, ev *v1.TaskEvent) {
	if ev.Time == nil {
		ev.Time = timestamppb.New(e.d.now())
	}
	b, err := proto.Marshal(ev)
	if err == nil {
		pipe := e.d.redis.Pipeline()
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: bus.TaskEventsKey(taskID), MaxLen: bus.TaskEventsMaxLen, Approx: true, Values: []any{"e", b}})
		pipe.Publish(ctx, bus.TaskEventsChannel, taskID)
		_, err = pipe.Exec(ctx)
	}
	if err != nil {
		e.d.log.Warn("task event not published", "task_id", taskID, "err", err)
	}
	if st := ev.GetState(); st != nil && terminal(st.TaskState) {
		e.finished(ctx, taskID)
	}
}

// publishState appends a state change of an attempt.
func (e *Events) publishState(ctx context.Context, taskID string, attempt int, sc *v1.StateChange) {
	e.Publish(ctx, taskID, &v1.TaskEvent{Attempt: int32(attempt), Event: &v1.TaskEvent_State{State: sc}})
}

// finished lets a finished task's events expire.
func (e *Events) finished(ctx context.Context, taskID string) {
	pipe := e.d.redis.Pipeline()
	pipe.Expire(ctx, bus.TaskEventsKey(taskID), bus.TaskEventsKeep)
	pipe.Expire(ctx, bus.TaskAcksKey(taskID), bus.TaskEventsKeep)
	if _, err := pipe.Exec(ctx); err != nil {
		e.d.log.Warn("task events kept without expiry", "task_id", taskID, "err", err)
	}
}

var cursorRE = regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`)

// followPoll is how long a quiet follower waits for its task's stream to
// grow before it checks the task's row (an event or a notification lost on
// the way must not hang it).
const followPoll = 2 * time.Second

// Follow sends a task's events after cursor until the task's terminal
// event, or ctx ends. With noWait it ends once the stored events are sent.
func (e *Events) Follow(ctx context.Context, workspaceID, taskID, cursor string, noWait bool, send func(*v1.TaskEvent) error) error {
	if cursor != "" && !cursorRE.MatchString(cursor) {
		return fmt.Errorf("cursor %q is not one this API returned: %w", cursor, errdefs.ErrInvalidArgument)
	}
	if _, _, err := e.d.store.GetTask(ctx, workspaceID, taskID); err != nil {
		return err
	}
	last := cursor
	if last == "" {
		last = "0"
	}
	// Registered before the first read, so no growth is missed between a
	// read that found nothing and the wait.
	grew, done := e.watch(taskID)
	defer done()
	// checkRow is whether a quiet stream sends the follower to the row:
	// at first (a stream that expired) and after followPoll without
	// growth (a last event lost), not after each burst of a live stream,
	// which would cost a Postgres read per batch of lines per follower.
	quiet, checkRow := false, true
	for {
		if quiet {
			t := e.d.clock.NewTimer(followPoll)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-grew:
				t.Stop()
			case <-t.C():
				checkRow = true
			}
		}
		n, end, err := e.sendAfter(ctx, taskID, &last, send)
		if err != nil || end {
			return err
		}
		if quiet = n == 0; !quiet {
			checkRow = false
			continue
		}
		if noWait {
			return e.caughtUp(ctx, workspaceID, taskID, last, send)
		}
		if !checkRow {
			continue
		}
		select {
		case <-grew:
			continue // it grew while we read
		default:
		}
		// Quiet: the task may have ended with its last event lost, or
		// expired from Redis. The row is the truth.
		t, atts, err := e.d.store.GetTask(ctx, workspaceID, taskID)
		if err != nil {
			return err
		}
		pb := taskPB(t, atts)
		if !terminal(pb.State) {
			continue
		}
		// One more non-blocking look for entries that raced the check.
		more, err := e.d.redis.XRead(ctx, &redis.XReadArgs{Streams: []string{bus.TaskEventsKey(taskID), last}, Count: 1, Block: -1}).Result()
		if err == nil && len(more) > 0 && len(more[0].Messages) > 0 {
			continue
		}
		return send(finalEvent(pb, last))
	}
}

// sendAfter sends the stored events after *last (moving it), and reports
// how many it read and whether one was the task's end.
func (e *Events) sendAfter(ctx context.Context, taskID string, last *string, send func(*v1.TaskEvent) error) (int, bool, error) {
	res, err := e.d.redis.XRead(ctx, &redis.XReadArgs{Streams: []string{bus.TaskEventsKey(taskID), *last}, Count: 512, Block: -1}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		if ctx.Err() != nil {
			return 0, false, ctx.Err()
		}
		return 0, false, fmt.Errorf("read events of task %s: %w: %w", taskID, errdefs.ErrUnavailable, err)
	}
	n := 0
	for _, s := range res {
		for _, msg := range s.Messages {
			n++
			*last = msg.ID
			ev, err := decodeEvent(msg)
			if err != nil {
				e.d.log.Warn("skipping an undecodable task event", "task_id", taskID, "id", msg.ID, "err", err)
				continue
			}
			if err := send(ev); err != nil {
				return n, false, err
			}
			if st := ev.GetState(); st != nil && terminal(st.TaskState) {
				return n, true, nil
			}
		}
	}
	return n, false, nil
}

// caughtUp ends a no-wait follow: a finished task whose terminal event is
// not in its stream (lost, or expired) gets one rebuilt from its row.
func (e *Events) caughtUp(ctx context.Context, workspaceID, taskID, last string, send func(*v1.TaskEvent) error) error {
	t, atts, err := e.d.store.GetTask(ctx, workspaceID, taskID)
	if err != nil {
		return err
	}
	if pb := taskPB(t, atts); terminal(pb.State) {
		return send(finalEvent(pb, last))
	}
	return nil
}

func decodeEvent(msg redis.XMessage) (*v1.TaskEvent, error) {
	raw, ok := msg.Values["e"].(string)
	if !ok {
		return nil, errors.New("no event field")
	}
	ev := &v1.TaskEvent{}
	if err := proto.Unmarshal([]byte(raw), ev); err != nil {
		return nil, err
	}
	ev.Cursor = msg.ID
	return ev, nil
}

// finalEvent is the terminal event rebuilt from the task's row.
func finalEvent(t *v1.Task, cursor string) *v1.TaskEvent {
	ev := &v1.TaskEvent{Cursor: cursor, Time: t.FinishedAt, Attempt: int32(len(t.Attempts)),
		Event: &v1.TaskEvent_State{State: &v1.StateChange{TaskState: t.State, ExitCode: t.ExitCode, Message: t.Message}}}
	if n := len(t.Attempts); n > 0 {
		a := t.Attempts[n-1]
		ev.GetState().AttemptState = a.State
		ev.GetState().MachineId = a.MachineId
	}
	if ev.Time == nil {
		ev.Time = timestamppb.Now()
	}
	return ev
}

// watch registers interest in a task's stream: the channel gets a value
// (at most one pending) whenever the stream grows. done unregisters.
func (e *Events) watch(taskID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	e.mu.Lock()
	if e.watchers[taskID] == nil {
		e.watchers[taskID] = map[chan struct{}]bool{}
	}
	e.watchers[taskID][ch] = true
	e.mu.Unlock()
	return ch, func() {
		e.mu.Lock()
		delete(e.watchers[taskID], ch)
		if len(e.watchers[taskID]) == 0 {
			delete(e.watchers, taskID)
		}
		e.mu.Unlock()
	}
}

// grew wakes the followers of a task on this replica.
func (e *Events) grew(taskID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for ch := range e.watchers[taskID] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
