package tasks

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/store"
)

// queue is the pools' queues of pending tasks in Redis: one sorted set per
// pool (bus.QueueKey), member "workspace/task", score the submit time.
// Postgres keeps the durable record; the rescuer re-adds any pending task
// Redis lost, and ZADD NX makes adding twice harmless.
type queue struct{ d *deps }

// scanDepth bounds how many queued tasks one pass looks at per pool.
const scanDepth = 1000

func member(workspaceID, taskID string) string { return workspaceID + "/" + taskID }

func (q *queue) add(ctx context.Context, p store.PendingTask) error {
	return q.d.redis.ZAddNX(ctx, bus.QueueKey(p.Pool), redis.Z{Score: float64(p.CreatedAt.UnixMilli()), Member: member(p.WorkspaceID, p.ID)}).Err()
}

// remove takes a task out of its pool's queue; a failure only leaves work
// for the next pass (which drops members that are not PENDING).
func (q *queue) remove(ctx context.Context, pool, workspaceID, taskID string) {
	if err := q.d.redis.ZRem(ctx, bus.QueueKey(pool), member(workspaceID, taskID)).Err(); err != nil {
		q.d.log.Warn("task left in the queue", "task_id", taskID, "pool", pool, "err", err)
	}
}

// queued is one entry of a pool's queue.
type queued struct{ workspaceID, taskID string }

// head returns up to scanDepth of a pool's oldest entries; malformed
// members are dropped from the queue.
func (q *queue) head(ctx context.Context, pool string) ([]queued, error) {
	members, err := q.d.redis.ZRange(ctx, bus.QueueKey(pool), 0, scanDepth-1).Result()
	if err != nil {
		return nil, err
	}
	out := make([]queued, 0, len(members))
	for _, m := range members {
		ws, id, ok := strings.Cut(m, "/")
		if !ok {
			_ = q.d.redis.ZRem(ctx, bus.QueueKey(pool), m).Err()
			continue
		}
		out = append(out, queued{ws, id})
	}
	return out, nil
}
