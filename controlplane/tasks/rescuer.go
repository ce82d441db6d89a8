package tasks

import (
	"context"
	"fmt"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
)

// Rescuer gives up attempts whose machine is lost and puts their task back
// in its queue when it has retries left (river's JobRescuer, for attempts):
//
//   - an attempt on a deleted machine is lost at once;
//   - one on a machine whose tunnel has been gone longer than
//     controlplane.lostAgentGrace is lost then (the grace runs from when
//     this replica first saw it offline);
//   - every rescueEvery ticks, pending tasks that Redis lost (a restart, a
//     failed enqueue) go back into their pool's queue.
//
// Task timeouts are the agent's: it kills a container that outlives its
// timeout and reports TIMED_OUT; a machine that never reports is lost by
// the rules above. Every replica runs a Rescuer; LoseAttempt's conditional
// update makes a second replica's verdict a no-op.
type Rescuer struct {
	d      *deps
	q      *queue
	events *Events
	wake   func()
	life   lifecycle
	// offlineSince belongs to the loop goroutine.
	offlineSince map[string]time.Time
}

// rescueEvery is how many ticks pass between two queue rescues.
const rescueEvery = 5

func newRescuer(d *deps, q *queue, ev *Events, wake func()) *Rescuer {
	return &Rescuer{d: d, q: q, events: ev, wake: wake, life: lifecycle{name: "rescuer"}, offlineSince: map[string]time.Time{}}
}

// Start runs the checks every tick until Stop.
func (r *Rescuer) Start(ctx context.Context) error {
	if _, err := r.life.begin(ctx); err != nil {
		return err
	}
	r.life.goRun(r.loop)
	return nil
}

// Stop ends the loop and waits for it.
func (r *Rescuer) Stop() { r.life.stop() }

func (r *Rescuer) loop(ctx context.Context) {
	t := r.d.clock.NewTicker(r.d.tick)
	defer t.Stop()
	for ticks := 0; ; ticks++ {
		if ticks%rescueEvery == 0 {
			r.requeue(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		r.checkLost(ctx)
	}
}

// requeue re-adds pending tasks Redis does not have; adding is idempotent.
func (r *Rescuer) requeue(ctx context.Context) {
	pending, err := r.d.store.PendingTasks(ctx, 10000)
	if err != nil {
		r.d.log.Debug("queue rescue skipped", "err", err)
		return
	}
	for _, p := range pending {
		if err := r.q.add(ctx, p); err != nil {
			r.d.log.Debug("queue rescue stopped", "err", err)
			return
		}
	}
}

// checkLost gives up the active attempts of machines that were deleted or
// whose tunnel has been gone longer than the grace.
func (r *Rescuer) checkLost(ctx context.Context) {
	ag, err := r.d.agents()
	if err != nil {
		return
	}
	active, err := r.d.store.ActiveAttempts(ctx, "")
	if err != nil {
		r.d.log.Debug("lost-agent check skipped", "err", err)
		return
	}
	grace := r.d.config.Controlplane.LostGrace()
	now := r.d.now()
	seen := map[string]bool{}
	for _, a := range active {
		if a.MachineDeleted {
			r.Lose(ctx, a.TaskID, a.Number, a.MachineID, "machine "+a.MachineID+" was deleted")
			continue
		}
		if _, online := ag.Online(a.MachineID); online {
			continue
		}
		seen[a.MachineID] = true
		since, ok := r.offlineSince[a.MachineID]
		if !ok {
			r.offlineSince[a.MachineID] = now
			continue
		}
		if gone := now.Sub(since); gone >= grace {
			r.Lose(ctx, a.TaskID, a.Number, a.MachineID, fmt.Sprintf("machine %s has been offline for %s", a.MachineID, gone.Round(100*time.Millisecond)))
		}
	}
	for id := range r.offlineSince {
		if !seen[id] {
			delete(r.offlineSince, id)
		}
	}
}

// Lose marks an active attempt lost, publishes what became of its task,
// requeues the task when it has retries left, and returns the task's new
// state. Idempotent: an attempt that is no longer active is left alone.
// Safe for concurrent use.
func (r *Rescuer) Lose(ctx context.Context, taskID string, n int, machineID, why string) v1.TaskState {
	if sc := r.loseQuiet(ctx, taskID, n, machineID, why); sc != nil {
		r.events.publishState(ctx, taskID, n, sc)
		return sc.TaskState
	}
	t, _, err := r.d.store.GetTask(ctx, "", taskID)
	if err != nil {
		return v1.TaskState_TASK_STATE_UNSPECIFIED
	}
	return taskStatePB(t.State)
}

// loseQuiet is Lose without publishing: it returns the event to publish,
// or nil when the attempt was not active any more.
func (r *Rescuer) loseQuiet(ctx context.Context, taskID string, n int, machineID, why string) *v1.StateChange {
	st, changed, err := r.d.store.LoseAttempt(ctx, taskID, n, why)
	r.d.placed.forget(taskID)
	if err != nil {
		r.d.log.Warn("could not mark an attempt lost", "task_id", taskID, "attempt", n, "err", err)
		return nil
	}
	if !changed {
		return nil
	}
	r.d.log.Info("attempt lost", "task_id", taskID, "attempt", n, "machine_id", machineID, "why", why, "task_state", st)
	msg := fmt.Sprintf("attempt %d lost: %s", n, why)
	if st == store.TaskPending {
		msg += "; retrying"
		r.requeueTask(ctx, taskID)
	}
	r.wake()
	return &v1.StateChange{TaskState: taskStatePB(st), AttemptState: v1.AttemptState_ATTEMPT_STATE_LOST, MachineId: machineID, Message: msg}
}

// requeueTask puts a task that went back to PENDING on its pool's queue (the
// rescuer's periodic pass re-adds it if this fails).
func (r *Rescuer) requeueTask(ctx context.Context, taskID string) {
	if t, _, err := r.d.store.GetTask(ctx, "", taskID); err == nil {
		if err := r.q.add(ctx, store.PendingTask{ID: t.ID, WorkspaceID: t.WorkspaceID, Pool: t.Pool, CreatedAt: t.CreatedAt}); err != nil {
			r.d.log.Warn("task not requeued yet (the rescuer will)", "task_id", taskID, "err", err)
		}
	}
}
