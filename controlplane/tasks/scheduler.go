package tasks

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
)

// Pending tasks wait in one sorted set per pool (member "workspace/task",
// score the submit time); Postgres keeps the durable record and the rescuer
// re-adds any pending task Redis lost. Replicas wake each other through a
// channel when capacity or work appears.
func queueKey(pool string) string { return "levers9:queue:" + pool }
func lockKey(pool string) string  { return "levers9:sched:lock:" + pool }

const wakeChannel = "levers9:sched"

// scanDepth bounds how many queued tasks one pass looks at per pool.
const scanDepth = 1000

func (m *Manager) enqueue(ctx context.Context, p store.PendingTask) error {
	return m.cfg.Redis.ZAddNX(ctx, queueKey(p.Pool), redis.Z{Score: float64(p.CreatedAt.UnixMilli()), Member: p.WorkspaceID + "/" + p.ID}).Err()
}

func (m *Manager) dequeue(ctx context.Context, pool, workspaceID, taskID string) {
	if err := m.cfg.Redis.ZRem(ctx, queueKey(pool), workspaceID+"/"+taskID).Err(); err != nil {
		m.log.Warn("task left in the queue", "task_id", taskID, "err", err)
	}
}

// Wake asks every replica's scheduler for a pass now.
func (m *Manager) Wake() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = m.cfg.Redis.Publish(ctx, wakeChannel, m.replica).Err()
}

// listen turns other replicas' wake-ups into local ones and tells local
// followers that their task's stream grew.
func (m *Manager) listen(ctx context.Context) {
	defer m.wg.Done()
	sub := m.cfg.Redis.Subscribe(ctx, wakeChannel, eventsChannel)
	defer sub.Close()
	ch := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			if msg.Channel == eventsChannel {
				m.grew(msg.Payload)
				continue
			}
			if msg.Payload != m.replica {
				select {
				case m.wake <- struct{}{}:
				default:
				}
			}
		}
	}
}

// loop runs passes when woken and every tick; the lost-agent check and the
// queue rescue run on ticks.
func (m *Manager) loop(ctx context.Context) {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.Tick)
	defer t.Stop()
	ticks := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		case <-t.C:
			ticks++
			m.checkLost(ctx)
			if ticks%5 == 1 {
				m.rescue(ctx)
			}
		}
		for _, pool := range m.poolNames() {
			m.schedulePool(ctx, pool)
		}
	}
}

func (m *Manager) poolNames() []string {
	names := make([]string, 0, len(m.cfg.Config.Worker.Pools))
	for n := range m.cfg.Config.Worker.Pools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// rescue re-adds pending tasks Redis does not have (a Redis restart, a
// failed enqueue); ZADD NX makes it harmless for the rest.
func (m *Manager) rescue(ctx context.Context) {
	pending, err := m.cfg.Store.PendingTasks(ctx, 10000)
	if err != nil {
		m.log.Debug("queue rescue skipped", "err", err)
		return
	}
	for _, p := range pending {
		if err := m.enqueue(ctx, p); err != nil {
			m.log.Debug("queue rescue stopped", "err", err)
			return
		}
	}
}

var unlockScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// machineRoom is what a machine has free for this pass.
type machineRoom struct {
	id   string
	cpu  int64
	mem  int64
	gpus []gpuSlot
	cap  store.Capacity
}

type gpuSlot struct{ id, name string }

type capacity struct {
	cpu, mem int64
	gpus     []gpuSlot
}

func (c capacity) matchingGPUs(kind string) []gpuSlot {
	if kind == "" {
		return c.gpus
	}
	var out []gpuSlot
	for _, g := range c.gpus {
		if strings.Contains(strings.ToLower(g.name), strings.ToLower(kind)) {
			out = append(out, g)
		}
	}
	return out
}

// capacityOf is a machine's total, from its last inventory.
func capacityOf(pm store.PoolMachine) capacity {
	inv := &v1.Inventory{}
	if len(pm.Inventory) > 0 {
		_ = protojson.Unmarshal(pm.Inventory, inv)
	}
	c := capacity{cpu: int64(inv.Cpus) * 1000, mem: int64(inv.MemoryBytes)}
	for _, g := range inv.Gpus {
		id := g.Uuid
		if id == "" {
			id = fmt.Sprint(g.Index)
		}
		c.gpus = append(c.gpus, gpuSlot{id: id, name: g.Name})
	}
	return c
}

// schedulePool places what it can of one pool's queue. One replica at a time
// does a pool (a short Redis lock); the placement transaction is what keeps
// it correct when the lock expires mid-pass.
func (m *Manager) schedulePool(ctx context.Context, pool string) {
	ok, err := m.cfg.Redis.SetNX(ctx, lockKey(pool), m.replica, 10*time.Second).Result()
	if err != nil || !ok {
		return
	}
	defer unlockScript.Run(context.WithoutCancel(ctx), m.cfg.Redis, []string{lockKey(pool)}, m.replica)
	queued, err := m.cfg.Redis.ZRange(ctx, queueKey(pool), 0, scanDepth-1).Result()
	if err != nil || len(queued) == 0 {
		return
	}
	ag := m.cfg.Agents()
	if ag == nil {
		return
	}
	machines, err := m.cfg.Store.PoolMachines(ctx, pool)
	if err != nil {
		m.log.Warn("scheduling pass skipped", "pool", pool, "err", err)
		return
	}
	var rooms []*machineRoom
	for _, pm := range machines {
		if _, online := ag.Online(pm.ID); !online {
			continue
		}
		c := capacityOf(pm)
		used := map[string]bool{}
		for _, g := range pm.UsedGPUs {
			used[g] = true
		}
		r := &machineRoom{id: pm.ID, cpu: c.cpu - pm.UsedCPU, mem: c.mem - pm.UsedMem, cap: store.Capacity{CPUMillis: c.cpu, MemoryBytes: c.mem}}
		for _, g := range c.gpus {
			if !used[g.id] {
				r.gpus = append(r.gpus, g)
			}
		}
		rooms = append(rooms, r)
	}
	if len(rooms) == 0 {
		return
	}
	active, err := m.cfg.Store.ActiveByWorkspace(ctx, pool)
	if err != nil {
		return
	}
	// Fair share: the workspace with the fewest placed tasks goes next
	// (ties: the one this replica served least recently), each taking its
	// oldest task first.
	byWS := map[string][]string{}
	var order []string
	for _, member := range queued {
		ws, id, ok := strings.Cut(member, "/")
		if !ok {
			_ = m.cfg.Redis.ZRem(ctx, queueKey(pool), member).Err()
			continue
		}
		if _, seen := byWS[ws]; !seen {
			order = append(order, ws)
		}
		byWS[ws] = append(byWS[ws], id)
	}
	for {
		ws := ""
		for _, w := range order {
			if len(byWS[w]) == 0 {
				continue
			}
			if ws == "" || active[w] < active[ws] ||
				(active[w] == active[ws] && m.served[pool+"/"+w].Before(m.served[pool+"/"+ws])) {
				ws = w
			}
		}
		if ws == "" || ctx.Err() != nil {
			return
		}
		id := byWS[ws][0]
		byWS[ws] = byWS[ws][1:]
		if m.place(ctx, pool, ws, id, rooms) {
			active[ws]++
			m.served[pool+"/"+ws] = m.now()
		}
	}
}

// place tries one queued task on the roomiest machine that fits it.
func (m *Manager) place(ctx context.Context, pool, ws, id string, rooms []*machineRoom) bool {
	t, atts, err := m.cfg.Store.GetTask(ctx, "", id)
	if err != nil || t.State != store.TaskPending {
		if err == nil || errorsIsNotFound(err) {
			m.dequeue(ctx, pool, ws, id)
		}
		return false
	}
	lostOn := map[string]bool{}
	for _, a := range atts {
		lostOn[a.MachineID] = true
	}
	var best *machineRoom
	var bestGPUs []gpuSlot
	for pass := 0; pass < 2 && best == nil; pass++ {
		for _, r := range rooms {
			if pass == 0 && lostOn[r.id] {
				continue // a new attempt goes elsewhere when it can
			}
			if r.cpu < t.CPUMillis || r.mem < t.MemoryBytes {
				continue
			}
			gpus := capacity{gpus: r.gpus}.matchingGPUs(t.GPUType)
			if len(gpus) < t.GPUs {
				continue
			}
			if best == nil || r.cpu > best.cpu {
				best, bestGPUs = r, gpus[:t.GPUs]
			}
		}
	}
	if best == nil {
		return false
	}
	devs := make([]string, len(bestGPUs))
	for i, g := range bestGPUs {
		devs[i] = g.id
	}
	a, err := m.cfg.Store.PlaceAttempt(ctx, t.ID, best.id, best.cap, t.CPUMillis, t.MemoryBytes, devs)
	if err != nil {
		if !errors.Is(err, store.ErrNotPlaced) {
			m.log.Warn("placement failed", "task_id", t.ID, "machine_id", best.id, "err", err)
		}
		return false
	}
	best.cpu -= t.CPUMillis
	best.mem -= t.MemoryBytes
	taken := map[string]bool{}
	for _, d := range devs {
		taken[d] = true
	}
	var left []gpuSlot
	for _, g := range best.gpus {
		if !taken[g.id] {
			left = append(left, g)
		}
	}
	best.gpus = left
	m.dequeue(ctx, pool, ws, id)
	sc := &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_SCHEDULED, AttemptState: v1.AttemptState_ATTEMPT_STATE_SCHEDULED,
		MachineId: best.id, NewAttempt: a.Number > 1, Message: "placed on machine " + best.id}
	if a.Number > 1 && len(atts) > 0 {
		prev := atts[len(atts)-1]
		sc.Message = fmt.Sprintf("attempt %d on machine %s (attempt %d %s: %s)", a.Number, best.id, prev.Number, strings.ToLower(prev.State), prev.Message)
	}
	m.publish(ctx, t.ID, &v1.TaskEvent{Attempt: int32(a.Number), Event: &v1.TaskEvent_State{State: sc}})
	t.Attempts = a.Number
	go m.dispatch(t, a)
	return true
}

// dispatch pushes a placed attempt to its agent; an agent that cannot be
// reached loses the attempt at once rather than after the grace period.
func (m *Manager) dispatch(t store.Task, a store.Attempt) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err := func() error {
		ta, err := m.attemptFor(t, a)
		if err != nil {
			return err
		}
		conn, err := m.agents(ctx, a.MachineID)
		if err != nil {
			return err
		}
		_, err = agentv1.NewAgentClient(conn).RunTask(ctx, &agentv1.RunTaskRequest{Attempt: ta})
		return err
	}()
	if err == nil {
		return
	}
	m.log.Warn("could not start an attempt on its machine", "task_id", t.ID, "attempt", a.Number, "machine_id", a.MachineID, "err", err)
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied:
		// The agent refused the attempt itself: another machine would too.
		at := m.now()
		code := -1
		if ok, ferr := m.cfg.Store.FinishAttempt(ctx, t.ID, a.Number, store.AttemptEnd{State: store.TaskFailed, ExitCode: &code,
			Message: "refused by machine " + a.MachineID + ": " + status.Convert(err).Message(), At: at}); ferr == nil && ok {
			m.publish(ctx, t.ID, &v1.TaskEvent{Attempt: int32(a.Number), Event: &v1.TaskEvent_State{State: &v1.StateChange{
				TaskState: v1.TaskState_TASK_STATE_FAILED, AttemptState: v1.AttemptState_ATTEMPT_STATE_FAILED, MachineId: a.MachineID,
				ExitCode: int32(code), Message: "refused by machine " + a.MachineID + ": " + status.Convert(err).Message()}}})
			m.Wake()
		}
	default:
		m.lose(context.Background(), t.ID, a.Number, a.MachineID, "could not be started on machine "+a.MachineID+": "+err.Error())
	}
}
