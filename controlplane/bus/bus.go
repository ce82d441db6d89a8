// Package bus owns the controlplane's use of Redis: the client, a health
// ping, the workspace event stream, the machines' egress reports, and the
// one map of every Redis key and channel (keys.go) that the other parts
// (agent presence and forwarding, the task queues, scheduler lock and event
// streams) must use instead of spelling keys themselves. Redis is never the
// durable truth: losing it loses live events, presence and queue order,
// never a task or machine, which Postgres keeps. It never logs the Redis
// password. API: internal.
package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// Bus is a Redis client. Safe for concurrent use.
type Bus struct {
	rdb   *redis.Client
	clock clock.Clock
}

// Options says how to reach Redis.
type Options struct {
	Addr     string
	Password string
	DB       int
	// Clock stamps published events (default the wall clock).
	Clock clock.Clock
}

// New makes a client; it connects lazily and reconnects by itself.
func New(o Options) *Bus {
	return &Bus{rdb: redis.NewClient(&redis.Options{
		Addr:         o.Addr,
		Password:     o.Password,
		DB:           o.DB,
		DialTimeout:  2 * time.Second,
		ReadTimeout:  2 * time.Second,
		WriteTimeout: 2 * time.Second,
		MaxRetries:   1,
	}), clock: clock.OrReal(o.Clock)}
}

// Close closes the client.
func (b *Bus) Close() error { return b.rdb.Close() }

// Ping checks that Redis answers.
func (b *Bus) Ping(ctx context.Context) error {
	if err := b.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %v: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}

// Event is one workspace event. Fields never carry secrets.
type Event struct {
	Workspace string
	Kind      string // e.g. token.created, secret.deleted
	Object    string // the object's ID or name
}

// Publish appends an event to the stream.
func (b *Bus) Publish(ctx context.Context, e Event) error {
	err := b.rdb.XAdd(ctx, &redis.XAddArgs{
		Stream: EventStream,
		MaxLen: EventStreamMaxLen,
		Approx: true,
		Values: map[string]any{"workspace": e.Workspace, "kind": e.Kind, "object": e.Object, "at": b.clock.Now().UTC().Format(time.RFC3339Nano)},
	}).Err()
	if err != nil {
		return fmt.Errorf("publish %s: %v: %w", e.Kind, err, errdefs.ErrUnavailable)
	}
	return nil
}

// Redis is the client, for parts that keep their own keys (agent presence).
func (b *Bus) Redis() *redis.Client { return b.rdb }

// PutEgressReport keeps a machine's latest egress readiness report (encoded
// by the caller) for ttl.
func (b *Bus) PutEgressReport(ctx context.Context, machineID string, report []byte, ttl time.Duration) error {
	if err := b.rdb.Set(ctx, EgressReportKey(machineID), report, ttl).Err(); err != nil {
		return fmt.Errorf("store egress report of %s: %v: %w", machineID, err, errdefs.ErrUnavailable)
	}
	return nil
}

// EgressReports returns the latest reports of the given machines; machines
// without one are absent.
func (b *Bus) EgressReports(ctx context.Context, machineIDs []string) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(machineIDs) == 0 {
		return out, nil
	}
	keys := make([]string, len(machineIDs))
	for i, id := range machineIDs {
		keys[i] = EgressReportKey(id)
	}
	vals, err := b.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("read egress reports: %v: %w", err, errdefs.ErrUnavailable)
	}
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[machineIDs[i]] = []byte(s)
		}
	}
	return out, nil
}

// Deliver hands each message of sub to handle, in order, until ctx ends or
// the subscription closes, then closes sub. It blocks: run it in the
// goroutine that owns the subscription.
func Deliver(ctx context.Context, sub *redis.PubSub, handle func(*redis.Message)) {
	defer sub.Close()
	ch := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			handle(m)
		}
	}
}
