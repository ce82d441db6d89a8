package tasks

import (
	"context"
	"errors"
	"fmt"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

func errorsIsNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }

// checkLost gives up the active attempts of machines that were deleted or
// whose tunnel has been gone longer than controlplane.lostAgentGrace.
// Every replica runs it; LoseAttempt's conditional update makes a second
// replica's verdict a no-op.
func (m *Manager) checkLost(ctx context.Context) {
	ag := m.cfg.Agents()
	if ag == nil {
		return
	}
	active, err := m.cfg.Store.ActiveAttempts(ctx, "")
	if err != nil {
		m.log.Debug("lost-agent check skipped", "err", err)
		return
	}
	grace := m.cfg.Config.Controlplane.LostGrace()
	now := m.now()
	seen := map[string]bool{}
	for _, a := range active {
		if a.MachineDeleted {
			m.lose(ctx, a.TaskID, a.Number, a.MachineID, "machine "+a.MachineID+" was deleted")
			continue
		}
		if _, online := ag.Online(a.MachineID); online {
			continue
		}
		seen[a.MachineID] = true
		since, ok := m.offlineSince[a.MachineID]
		if !ok {
			m.offlineSince[a.MachineID] = now
			continue
		}
		if gone := now.Sub(since); gone >= grace {
			m.lose(ctx, a.TaskID, a.Number, a.MachineID, fmt.Sprintf("machine %s has been offline for %s", a.MachineID, gone.Round(100_000_000)))
		}
	}
	for id := range m.offlineSince {
		if !seen[id] {
			delete(m.offlineSince, id)
		}
	}
}

// lose marks an attempt lost, publishes what became of the task, requeues
// it when it has retries left, and returns the task's new state.
func (m *Manager) lose(ctx context.Context, taskID string, n int, machineID, why string) v1.TaskState {
	sc := m.loseQuiet(ctx, taskID, n, machineID, why)
	if sc != nil {
		m.publish(ctx, taskID, &v1.TaskEvent{Attempt: int32(n), Event: &v1.TaskEvent_State{State: sc}})
		return sc.TaskState
	}
	t, _, err := m.cfg.Store.GetTask(ctx, "", taskID)
	if err != nil {
		return v1.TaskState_TASK_STATE_UNSPECIFIED
	}
	return taskState(t.State)
}

// loseQuiet is lose without publishing: it returns the event to publish,
// or nil when the attempt was not active any more.
func (m *Manager) loseQuiet(ctx context.Context, taskID string, n int, machineID, why string) *v1.StateChange {
	st, changed, err := m.cfg.Store.LoseAttempt(ctx, taskID, n, why)
	if err != nil {
		m.log.Warn("could not mark an attempt lost", "task_id", taskID, "attempt", n, "err", err)
		return nil
	}
	if !changed {
		return nil
	}
	m.log.Info("attempt lost", "task_id", taskID, "attempt", n, "machine_id", machineID, "why", why, "task_state", st)
	msg := fmt.Sprintf("attempt %d lost: %s", n, why)
	if st == store.TaskPending {
		msg += "; retrying"
	}
	sc := &v1.StateChange{TaskState: taskState(st), AttemptState: v1.AttemptState_ATTEMPT_STATE_LOST, MachineId: machineID, Message: msg}
	if st == store.TaskPending {
		t, _, err := m.cfg.Store.GetTask(ctx, "", taskID)
		if err == nil {
			if err := m.enqueue(ctx, store.PendingTask{ID: t.ID, WorkspaceID: t.WorkspaceID, Pool: t.Pool, CreatedAt: t.CreatedAt}); err != nil {
				m.log.Warn("lost task not requeued yet (the rescuer will)", "task_id", taskID, "err", err)
			}
		}
	}
	m.Wake()
	return sc
}
