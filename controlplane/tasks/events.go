package tasks

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/errdefs"
)

// A task's events live in one Redis stream; the stream entry ID is the
// follow cursor. Agent records are appended with their sequence number
// checked against the attempt's acknowledged number in the same script, so
// a resent batch never duplicates lines.
func eventsKey(taskID string) string { return "levers9:task:" + taskID + ":events" }
func acksKey(taskID string) string   { return "levers9:task:" + taskID + ":acks" }

// maxEvents bounds one task's stream; older entries are trimmed.
const maxEvents = 200000

// keepFinished is how long a finished task's events stay followable.
const keepFinished = 7 * 24 * time.Hour

// eventsChannel carries the ID of a task whose stream grew, so followers
// wait on one subscription per replica instead of each holding a Redis
// connection in a blocking read.
const eventsChannel = "levers9:task-events"

var appendScript = redis.NewScript(`
local acked = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local first = tonumber(ARGV[2])
local n = #ARGV - 4
local added = 0
for i = 1, n do
  if first + i - 1 > acked then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[4 + i])
    added = added + 1
  end
end
local last = first + n - 1
if last > acked then
  redis.call('HSET', KEYS[2], ARGV[1], last)
  acked = last
end
if added > 0 then
  redis.call('PUBLISH', '` + eventsChannel + `', ARGV[4])
end
return acked
`)

// appendRecords appends encoded events numbered first.. for an attempt,
// skipping numbers already stored, and returns the acknowledged number.
func (m *Manager) appendRecords(ctx context.Context, taskID string, attempt int, first uint64, events [][]byte) (uint64, error) {
	args := make([]any, 0, 4+len(events))
	args = append(args, attempt, first, maxEvents, taskID)
	for _, e := range events {
		args = append(args, e)
	}
	acked, err := appendScript.Run(ctx, m.cfg.Redis, []string{eventsKey(taskID), acksKey(taskID)}, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("append events of task %s: %w: %w", taskID, errdefs.ErrUnavailable, err)
	}
	return uint64(acked), nil
}

// publish appends a controlplane event (no sequence number).
func (m *Manager) publish(ctx context.Context, taskID string, ev *v1.TaskEvent) {
	if ev.Time == nil {
		ev.Time = timestamppb.New(m.now())
	}
	b, err := proto.Marshal(ev)
	if err == nil {
		pipe := m.cfg.Redis.Pipeline()
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: eventsKey(taskID), MaxLen: maxEvents, Approx: true, Values: []any{"e", b}})
		pipe.Publish(ctx, eventsChannel, taskID)
		_, err = pipe.Exec(ctx)
	}
	if err != nil {
		// Followers fall back to the task's row for the final state.
		m.log.Warn("task event not published", "task_id", taskID, "err", err)
	}
	if st := ev.GetState(); st != nil && terminal(st.TaskState) {
		m.finished(ctx, taskID)
	}
}

// finished lets a finished task's events expire.
func (m *Manager) finished(ctx context.Context, taskID string) {
	pipe := m.cfg.Redis.Pipeline()
	pipe.Expire(ctx, eventsKey(taskID), keepFinished)
	pipe.Expire(ctx, acksKey(taskID), keepFinished)
	if _, err := pipe.Exec(ctx); err != nil {
		m.log.Warn("task events kept without expiry", "task_id", taskID, "err", err)
	}
}

func terminal(s v1.TaskState) bool {
	switch s {
	case v1.TaskState_TASK_STATE_SUCCEEDED, v1.TaskState_TASK_STATE_FAILED, v1.TaskState_TASK_STATE_CANCELLED, v1.TaskState_TASK_STATE_TIMED_OUT:
		return true
	}
	return false
}

var cursorRE = regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`)

// followPoll is how long a quiet follower waits for its task's stream to
// grow before it checks the task's row (an event or a notification lost on
// the way must not hang it).
const followPoll = 2 * time.Second

// Follow sends a task's events after cursor until the task's terminal
// event, or ctx ends.
// With noWait it ends once the stored events are sent.
func (m *Manager) Follow(ctx context.Context, workspaceID, taskID, cursor string, noWait bool, send func(*v1.TaskEvent) error) error {
	if cursor != "" && !cursorRE.MatchString(cursor) {
		return fmt.Errorf("cursor %q is not one this API returned: %w", cursor, errdefs.ErrInvalidArgument)
	}
	if _, _, err := m.cfg.Store.GetTask(ctx, workspaceID, taskID); err != nil {
		return err
	}
	last := cursor
	if last == "" {
		last = "0"
	}
	// Registered before the first read, so no growth is missed between a
	// read that found nothing and the wait.
	grew, done := m.watch(taskID)
	defer done()
	quiet := false
	for {
		if quiet {
			t := time.NewTimer(followPoll)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-grew:
				t.Stop()
			case <-t.C:
			}
		}
		res, err := m.cfg.Redis.XRead(ctx, &redis.XReadArgs{Streams: []string{eventsKey(taskID), last}, Count: 512, Block: -1}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("read events of task %s: %w: %w", taskID, errdefs.ErrUnavailable, err)
		}
		n := 0
		for _, s := range res {
			for _, msg := range s.Messages {
				n++
				last = msg.ID
				ev, err := decodeEvent(msg)
				if err != nil {
					m.log.Warn("skipping an undecodable task event", "task_id", taskID, "id", msg.ID, "err", err)
					continue
				}
				if err := send(ev); err != nil {
					return err
				}
				if st := ev.GetState(); st != nil && terminal(st.TaskState) {
					return nil
				}
			}
		}
		if quiet = n == 0; !quiet {
			continue
		}
		if noWait {
			return m.caughtUp(ctx, workspaceID, taskID, last, send)
		}
		select {
		case <-grew:
			continue // it grew while we read
		default:
		}
		// Quiet: the task may have ended with its last event lost, or
		// expired from Redis. The row is the truth.
		t, atts, err := m.cfg.Store.GetTask(ctx, workspaceID, taskID)
		if err != nil {
			return err
		}
		pb := taskPB(t, atts)
		if !terminal(pb.State) {
			continue
		}
		// One more non-blocking look for entries that raced the check.
		more, err := m.cfg.Redis.XRead(ctx, &redis.XReadArgs{Streams: []string{eventsKey(taskID), last}, Count: 1, Block: -1}).Result()
		if err == nil && len(more) > 0 && len(more[0].Messages) > 0 {
			continue
		}
		return send(finalEvent(pb, last))
	}
}

// caughtUp ends a no-wait follow: a finished task whose terminal event is
// not in its stream (lost, or expired) gets one rebuilt from its row.
func (m *Manager) caughtUp(ctx context.Context, workspaceID, taskID, last string, send func(*v1.TaskEvent) error) error {
	t, atts, err := m.cfg.Store.GetTask(ctx, workspaceID, taskID)
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
func (m *Manager) watch(taskID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	m.wmu.Lock()
	if m.watchers[taskID] == nil {
		m.watchers[taskID] = map[chan struct{}]bool{}
	}
	m.watchers[taskID][ch] = true
	m.wmu.Unlock()
	return ch, func() {
		m.wmu.Lock()
		delete(m.watchers[taskID], ch)
		if len(m.watchers[taskID]) == 0 {
			delete(m.watchers, taskID)
		}
		m.wmu.Unlock()
	}
}

// grew wakes the followers of a task on this replica.
func (m *Manager) grew(taskID string) {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	for ch := range m.watchers[taskID] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
