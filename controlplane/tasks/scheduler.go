package tasks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

// Scheduler places queued tasks on machines of their pool with room, and
// pushes each placed attempt down its machine's tunnel. A pass over every
// pool runs when woken (Wake, here or on any replica) and every tick. One
// replica at a time does a pool (a short Redis lock); the placement
// transaction is what keeps it correct when the lock expires mid-pass.
//
// Tenancy: a task goes only to a machine its workspace enrolled, or to any
// machine of a pool the operator shares with that workspace (tenancy);
// PlaceAttempt checks it again in its transaction.
//
// Fair share: in each pool the workspace with the fewest placed tasks goes
// next (ties: the one this replica served least recently), each taking its
// oldest task first; a new attempt avoids the machines earlier attempts
// ran on when another has room.
type Scheduler struct {
	d       *deps
	q       *queue
	events  *Events
	replica string
	// lose gives up an attempt that could not be pushed (Rescuer.Lose).
	lose func(ctx context.Context, taskID string, n int, machineID, why string) v1.TaskState
	life lifecycle
	wake chan struct{}
	// served belongs to the loop goroutine.
	served map[string]time.Time
}

func newScheduler(d *deps, q *queue, ev *Events) *Scheduler {
	return &Scheduler{d: d, q: q, events: ev, replica: ids.Random(8), life: lifecycle{name: "scheduler"},
		wake: make(chan struct{}, 1), served: map[string]time.Time{}}
}

// pushTimeout bounds one push of an attempt or a cancel to an agent.
const pushTimeout = 15 * time.Second

// Start runs the pass loop and listens for other replicas' wake-ups until
// Stop.
func (s *Scheduler) Start(ctx context.Context) error {
	if _, err := s.life.begin(ctx); err != nil {
		return err
	}
	s.life.goRun(s.listen)
	s.life.goRun(s.loop)
	return nil
}

// Stop ends the loops and waits for them and for every push in flight
// (cancelled: an attempt whose push was cut stays SCHEDULED, and its
// agent's next heartbeat tells whether it arrived).
func (s *Scheduler) Stop() { s.life.stop() }

// Wake asks every replica's scheduler for a pass now. Never blocks for
// long; safe before Start.
func (s *Scheduler) Wake() {
	s.nudge()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.d.redis.Publish(ctx, bus.SchedulerWakeChannel, s.replica).Err()
}

func (s *Scheduler) nudge() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// listen turns other replicas' wake-ups into local ones.
func (s *Scheduler) listen(ctx context.Context) {
	bus.Deliver(ctx, s.d.redis.Subscribe(ctx, bus.SchedulerWakeChannel), func(m *redis.Message) {
		if m.Payload != s.replica {
			s.nudge()
		}
	})
}

// loop runs a pass over every pool when woken and every tick.
func (s *Scheduler) loop(ctx context.Context) {
	t := s.d.clock.NewTicker(s.d.tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-t.C():
		}
		for _, pool := range s.d.config.Worker.PoolNames() {
			s.schedulePool(ctx, pool)
		}
	}
}

var unlockScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// schedulePool places what it can of one pool's queue.
func (s *Scheduler) schedulePool(ctx context.Context, pool string) {
	lock := bus.SchedulerLockKey(pool)
	ok, err := s.d.redis.SetNX(ctx, lock, s.replica, bus.SchedulerLockTTL).Result()
	if err != nil || !ok {
		return
	}
	defer unlockScript.Run(context.WithoutCancel(ctx), s.d.redis, []string{lock}, s.replica)
	head, err := s.q.head(ctx, pool)
	if err != nil || len(head) == 0 {
		return
	}
	rooms, err := s.d.rooms(ctx, pool)
	if err != nil {
		s.d.log.Warn("scheduling pass skipped", "pool", pool, "err", err)
		return
	}
	if len(rooms) == 0 {
		return
	}
	byWS := map[string][]string{}
	var order []string
	for _, e := range head {
		if _, seen := byWS[e.workspaceID]; !seen {
			order = append(order, e.workspaceID)
		}
		byWS[e.workspaceID] = append(byWS[e.workspaceID], e.taskID)
	}
	// Fair share needs the workspaces' placed tasks only when more than
	// one is queued (a Postgres query the common pass does without).
	active := map[string]int{}
	if len(order) > 1 {
		if active, err = s.d.store.ActiveByWorkspace(ctx, pool); err != nil {
			return
		}
	}
	tenancies := map[string]tenancy{}
	for ctx.Err() == nil {
		ws := s.nextWorkspace(pool, order, byWS, active)
		if ws == "" {
			return
		}
		id := byWS[ws][0]
		byWS[ws] = byWS[ws][1:]
		ten, ok := tenancies[ws]
		if !ok {
			if ten, err = s.d.tenancyOf(ctx, pool, ws); err != nil {
				s.d.log.Warn("workspace skipped in this pass", "pool", pool, "workspace_id", ws, "err", err)
				byWS[ws] = nil
				continue
			}
			tenancies[ws] = ten
		}
		if s.place(ctx, ten, id, rooms) {
			active[ws]++
			s.served[pool+"/"+ws] = s.d.now()
		}
	}
}

// rooms is what each online machine of the pool has free.
func (d *deps) rooms(ctx context.Context, pool string) ([]*machineRoom, error) {
	ag, err := d.agents()
	if err != nil {
		return nil, nil // nothing is online before the registry runs
	}
	machines, err := d.store.PoolMachines(ctx, pool)
	if err != nil {
		return nil, err
	}
	var rooms []*machineRoom
	for _, pm := range machines {
		if _, online := ag.Online(pm.ID); online {
			rooms = append(rooms, roomOf(pm))
		}
	}
	return rooms, nil
}

// nextWorkspace is the fair-share pick among workspaces with queued work
// ("" when none is left).
func (s *Scheduler) nextWorkspace(pool string, order []string, byWS map[string][]string, active map[string]int) string {
	ws := ""
	for _, w := range order {
		if len(byWS[w]) == 0 {
			continue
		}
		if ws == "" || active[w] < active[ws] ||
			(active[w] == active[ws] && s.served[pool+"/"+w].Before(s.served[pool+"/"+ws])) {
			ws = w
		}
	}
	return ws
}

// place tries one queued task of ten's workspace on the roomiest machine
// that may serve it and fits it.
func (s *Scheduler) place(ctx context.Context, ten tenancy, id string, rooms []*machineRoom) bool {
	pool, ws := ten.pool, ten.workspaceID
	t, atts, err := s.d.store.GetTask(ctx, ws, id)
	if err != nil || t.State != store.TaskPending {
		if err == nil || errors.Is(err, errdefs.ErrNotFound) {
			s.q.remove(ctx, pool, ws, id)
		}
		return false
	}
	best, devs := bestRoom(t, atts, rooms, ten)
	if best == nil {
		return false
	}
	a, err := s.d.store.PlaceAttempt(ctx, store.Placement{TaskID: t.ID, WorkspaceID: t.WorkspaceID, MachineID: best.id, Shared: ten.shared,
		Capacity: best.cap, CPUMillis: t.CPUMillis, MemoryBytes: t.MemoryBytes, GPUDevices: devs})
	if err != nil {
		if !errors.Is(err, store.ErrNotPlaced) {
			s.d.log.Warn("placement failed", "task_id", t.ID, "machine_id", best.id, "err", err)
		}
		return false
	}
	best.take(t.CPUMillis, t.MemoryBytes, devs)
	s.d.placed.remember(best.id, t.ID, a.Number, s.d.now())
	sc := &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_SCHEDULED, AttemptState: v1.AttemptState_ATTEMPT_STATE_SCHEDULED,
		MachineId: best.id, NewAttempt: a.Number > 1, Message: "placed on machine " + best.id}
	if a.Number > 1 && len(atts) > 0 {
		prev := atts[len(atts)-1]
		sc.Message = fmt.Sprintf("attempt %d on machine %s (attempt %d %s: %s)", a.Number, best.id, prev.Number, strings.ToLower(string(prev.State)), prev.Message)
	}
	t.Attempts = a.Number
	s.life.goRun(func(ctx context.Context) {
		// Off the queue and SCHEDULED to the followers beside the
		// dispatch's own reads; the push waits for both, so SCHEDULED
		// comes before anything the agent reports.
		announced := make(chan struct{})
		go func() {
			defer close(announced)
			s.q.remove(ctx, pool, ws, id)
			s.events.publishState(ctx, t.ID, a.Number, sc)
		}()
		s.dispatch(ctx, t, a, best.clusterWorker, announced)
	})
	return true
}

// bestRoom is the machine with the most free CPU that may serve the task
// (ten) and fits it (a machine an earlier attempt ran on only when no
// other fits), and the GPU devices to give it.
func bestRoom(t store.Task, atts []store.Attempt, rooms []*machineRoom, ten tenancy) (*machineRoom, []string) {
	ranOn := map[string]bool{}
	for _, a := range atts {
		ranOn[a.MachineID] = true
	}
	var best *machineRoom
	var bestGPUs []gpuSlot
	for pass := 0; pass < 2 && best == nil; pass++ {
		for _, r := range rooms {
			if !ten.serves(r.workspace) || (pass == 0 && ranOn[r.id]) {
				continue
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
	devs := make([]string, len(bestGPUs))
	for i, g := range bestGPUs {
		devs[i] = g.id
	}
	return best, devs
}
