package tasks

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// maxRecords bounds one report.
const maxRecords = 4096

// Report stores an attempt's records from the machine running it: output
// lines into the task's event stream, state updates into Postgres and the
// stream, each record once however often the agent resends it.
func (m *Manager) Report(ctx context.Context, machineID string, req *agentv1.ReportAttemptRequest) (*agentv1.ReportAttemptResponse, error) {
	taskID, n := req.GetTaskId(), int(req.GetAttempt())
	if len(req.GetRecords()) > maxRecords {
		return nil, fmt.Errorf("report of %d records, at most %d: %w", len(req.GetRecords()), maxRecords, errdefs.ErrInvalidArgument)
	}
	if req.GetFirstSeq() == 0 && len(req.GetRecords()) > 0 {
		return nil, fmt.Errorf("report: records are numbered from 1: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := m.cfg.Store.AttemptOwner(ctx, machineID, taskID, n); err != nil {
		if errorsIsNotFound(err) {
			// Not this machine's (or long gone): take the records so the
			// agent stops resending, and tell it to stop the attempt.
			last := req.GetFirstSeq() + uint64(len(req.GetRecords()))
			if last > 0 {
				last--
			}
			return &agentv1.ReportAttemptResponse{AckedSeq: last, Stop: true}, nil
		}
		return nil, err
	}
	var (
		batch    [][]byte
		first    = req.GetFirstSeq()
		acked    uint64
		err      error
		finished bool
	)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		acked, err = m.appendRecords(ctx, taskID, n, first, batch)
		first += uint64(len(batch))
		batch = batch[:0]
		return err
	}
	for _, rec := range req.GetRecords() {
		at := rec.GetTime().AsTime()
		if rec.GetTime() == nil {
			at = m.now()
		}
		switch r := rec.Record.(type) {
		case *agentv1.AttemptRecord_Log:
			b, err := proto.Marshal(&v1.TaskEvent{Time: timestamppb.New(at), Attempt: int32(n), Event: &v1.TaskEvent_Log{Log: r.Log}})
			if err != nil {
				return nil, err
			}
			batch = append(batch, b)
		case *agentv1.AttemptRecord_Update:
			if err := flush(); err != nil {
				return nil, err
			}
			sc, done, err := m.applyUpdate(ctx, machineID, taskID, n, r.Update, at)
			if err != nil {
				return nil, err
			}
			finished = finished || done
			b, err := proto.Marshal(&v1.TaskEvent{Time: timestamppb.New(at), Attempt: int32(n), Event: &v1.TaskEvent_State{State: sc}})
			if err != nil {
				return nil, err
			}
			batch = append(batch, b)
			if err := flush(); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("report: record %d has no log line or update: %w", first, errdefs.ErrInvalidArgument)
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(req.GetRecords()) == 0 {
		acked, _ = m.cfg.Redis.HGet(ctx, acksKey(taskID), fmt.Sprint(n)).Uint64()
	}
	if finished {
		m.finished(ctx, taskID)
		m.Wake()
	}
	wanted, err := m.cfg.Store.AttemptWanted(ctx, machineID, taskID, n)
	if err != nil {
		return nil, err
	}
	return &agentv1.ReportAttemptResponse{AckedSeq: acked, Stop: !wanted && !finished}, nil
}

// applyUpdate moves the attempt and task in Postgres (idempotent) and
// returns the event to publish and whether the attempt ended.
func (m *Manager) applyUpdate(ctx context.Context, machineID, taskID string, n int, u *agentv1.AttemptUpdate, at time.Time) (*v1.StateChange, bool, error) {
	sc := &v1.StateChange{AttemptState: u.GetState(), MachineId: machineID, ExitCode: u.GetExitCode(), Message: u.GetMessage()}
	switch u.GetState() {
	case v1.AttemptState_ATTEMPT_STATE_RUNNING:
		if _, err := m.cfg.Store.MarkRunning(ctx, taskID, n, at); err != nil {
			return nil, false, err
		}
		sc.TaskState = v1.TaskState_TASK_STATE_RUNNING
		return sc, false, nil
	case v1.AttemptState_ATTEMPT_STATE_LOST:
		if lost := m.loseQuiet(ctx, taskID, n, machineID, u.GetMessage()); lost != nil {
			return lost, true, nil
		}
		t, _, err := m.cfg.Store.GetTask(ctx, "", taskID)
		if err != nil {
			return nil, false, err
		}
		sc.TaskState = taskState(t.State)
		return sc, true, nil
	case v1.AttemptState_ATTEMPT_STATE_SUCCEEDED, v1.AttemptState_ATTEMPT_STATE_FAILED,
		v1.AttemptState_ATTEMPT_STATE_CANCELLED, v1.AttemptState_ATTEMPT_STATE_TIMED_OUT:
		name := u.GetState().String()[len("ATTEMPT_STATE_"):]
		e := store.AttemptEnd{State: name, Message: u.GetMessage(), DroppedLines: int64(u.GetDroppedLines()), ImageDigest: u.GetImageDigest(), At: at}
		code := int(u.GetExitCode())
		e.ExitCode = &code
		if _, err := m.cfg.Store.FinishAttempt(ctx, taskID, n, e); err != nil {
			return nil, false, err
		}
		sc.TaskState = taskState(name)
		return sc, true, nil
	}
	return nil, false, fmt.Errorf("report: attempt state %v is not one an agent reports: %w", u.GetState(), errdefs.ErrInvalidArgument)
}

// Running reconciles what an agent says it holds with what the controlplane
// placed on it: attempts it no longer holds are lost (once they had time to
// reach it), attempts it holds that are not wanted are returned to stop.
func (m *Manager) Running(ctx context.Context, machineID string, running []*agentv1.RunningAttempt) ([]*agentv1.RunningAttempt, error) {
	active, err := m.cfg.Store.ActiveAttempts(ctx, machineID)
	if err != nil {
		return nil, err
	}
	type key struct {
		id string
		n  int
	}
	held := map[key]bool{}
	for _, r := range running {
		held[key{r.GetTaskId(), int(r.GetAttempt())}] = true
	}
	for _, a := range active {
		if !held[key{a.TaskID, a.Number}] && m.now().Sub(a.ScheduledAt) > dispatchMargin {
			m.lose(ctx, a.TaskID, a.Number, machineID, "the agent on machine "+machineID+" no longer runs it (it restarted)")
		}
	}
	var stop []*agentv1.RunningAttempt
	for _, r := range running {
		wanted, err := m.cfg.Store.AttemptWanted(ctx, machineID, r.GetTaskId(), int(r.GetAttempt()))
		if err != nil {
			return nil, err
		}
		if !wanted {
			stop = append(stop, r)
		}
	}
	m.Wake()
	return stop, nil
}

// dispatchMargin is how long after placement an attempt may be missing
// from its agent's list (the push is on its way) before it counts as lost.
const dispatchMargin = 10 * time.Second
