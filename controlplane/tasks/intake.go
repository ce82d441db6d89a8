package tasks

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// intake takes what agents say about their attempts: records (output
// lines and state updates, each stored once however often the agent
// resends it) and, in every heartbeat, the attempts the agent holds. It
// starts nothing; the services it hands work to own the goroutines.
type intake struct {
	d       *deps
	events  *Events
	rescuer *Rescuer
	wake    func()
}

// maxRecords bounds one report.
const maxRecords = 4096

// dispatchMargin is how long after placement an attempt may be missing
// from its agent's list (the push is on its way) before it counts as lost.
const dispatchMargin = 10 * time.Second

// Report stores an attempt's records from the machine running it: output
// lines into the task's event stream, state updates into Postgres and the
// stream.
func (in *intake) Report(ctx context.Context, machineID string, req *agentv1.ReportAttemptRequest) (*agentv1.ReportAttemptResponse, error) {
	taskID, n := req.GetTaskId(), int(req.GetAttempt())
	if len(req.GetRecords()) > maxRecords {
		return nil, fmt.Errorf("report of %d records, at most %d: %w", len(req.GetRecords()), maxRecords, errdefs.ErrInvalidArgument)
	}
	if req.GetFirstSeq() == 0 && len(req.GetRecords()) > 0 {
		return nil, fmt.Errorf("report: records are numbered from 1: %w", errdefs.ErrInvalidArgument)
	}
	// Whether it is still wanted is known before the records are stored:
	// they only move it along (to RUNNING, or to its end, when Stop no
	// longer matters), and a cancel that lands meanwhile reaches the agent
	// with the cancel push or its next report.
	wanted := in.d.placed.wanted(machineID, taskID, n, in.d.now())
	if !wanted {
		var err error
		if _, wanted, err = in.d.store.AttemptOwner(ctx, machineID, taskID, n); err == nil && wanted {
			in.d.placed.remember(machineID, taskID, n, in.d.now())
		}
		if err != nil {
			return in.notOwned(req, err)
		}
	}
	acked, finished, err := in.store(ctx, machineID, req)
	if err != nil {
		return nil, err
	}
	if len(req.GetRecords()) == 0 {
		acked = in.events.acked(ctx, taskID, n)
	}
	if finished {
		in.d.placed.forget(taskID)
		in.events.finished(ctx, taskID)
		in.wake()
	}
	return &agentv1.ReportAttemptResponse{AckedSeq: acked, Stop: !wanted && !finished}, nil
}

// notOwned answers a report of an attempt the store could not confirm as
// the machine's: one that is not (or is long gone) has its records taken,
// so the agent stops resending, and is told to stop.
func (in *intake) notOwned(req *agentv1.ReportAttemptRequest, err error) (*agentv1.ReportAttemptResponse, error) {
	if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	last := req.GetFirstSeq() + uint64(len(req.GetRecords()))
	if last > 0 {
		last--
	}
	return &agentv1.ReportAttemptResponse{AckedSeq: last, Stop: true}, nil
}

// store appends a report's records in order, applying each state update
// between the lines around it, and returns the acknowledged number and
// whether the attempt ended.
//
// RUNNING is the exception: its Postgres write runs beside the stream
// append rather than ahead of it, so the first lines, which follow it in
// the same or the next report, do not wait for Postgres. The stream may
// then say RUNNING a moment before the row does (or, while Postgres is
// away, until it is back): the agent is not acknowledged until both are
// written, so it resends, and a resend writes the row and stores no
// record twice. Every other update still goes to Postgres first (it
// decides what the stream says: a retry, the task's end), and waits for
// a RUNNING write before it, so the row moves in the attempt's order.
func (in *intake) store(ctx context.Context, machineID string, req *agentv1.ReportAttemptRequest) (uint64, bool, error) {
	taskID, n := req.GetTaskId(), int(req.GetAttempt())
	var (
		batch    [][]byte
		first    = req.GetFirstSeq()
		acked    uint64
		finished bool
		// running, when not nil, yields the RUNNING write's result.
		running chan error
	)
	settle := func() error {
		if running == nil {
			return nil
		}
		err := <-running
		running = nil
		return err
	}
	// A return before the RUNNING write ended must not leave it running
	// with the request's context.
	defer func() { _ = settle() }()
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		var err error
		acked, err = in.events.appendRecords(ctx, taskID, n, first, batch)
		first += uint64(len(batch))
		batch = batch[:0]
		return err
	}
	for _, rec := range req.GetRecords() {
		at := in.d.now()
		if rec.GetTime() != nil {
			at = rec.GetTime().AsTime()
		}
		ev := &v1.TaskEvent{Time: timestamppb.New(at), Attempt: int32(n)}
		switch r := rec.Record.(type) {
		case *agentv1.AttemptRecord_Log:
			ev.Event = &v1.TaskEvent_Log{Log: r.Log}
		case *agentv1.AttemptRecord_Update:
			if st, _ := attemptStateOf(r.Update.GetState()); st == store.AttemptRunning {
				// A second RUNNING (never sent) waits for the first.
				if err := settle(); err != nil {
					return 0, false, err
				}
				applied, err := appliedJSON(r.Update.GetAppliedSecurity())
				if err != nil {
					return 0, false, fmt.Errorf("report %s/%d: %w", taskID, n, err)
				}
				running = make(chan error, 1)
				go func() {
					_, err := in.d.store.MarkRunning(ctx, taskID, n, at, applied)
					running <- err
				}()
				ev.Event = &v1.TaskEvent_State{State: &v1.StateChange{AttemptState: r.Update.GetState(), MachineId: machineID,
					Message: r.Update.GetMessage(), TaskState: v1.TaskState_TASK_STATE_RUNNING}}
				break
			}
			if err := flush(); err != nil {
				return 0, false, err
			}
			if err := settle(); err != nil {
				return 0, false, err
			}
			sc, done, err := in.applyUpdate(ctx, machineID, taskID, n, r.Update, at)
			if err != nil {
				return 0, false, err
			}
			finished = finished || done
			ev.Event = &v1.TaskEvent_State{State: sc}
		case *agentv1.AttemptRecord_Seccomp:
			// Cumulative totals: storing them again on a resend is a no-op.
			if err := in.d.store.RecordSeccomp(ctx, taskID, n, seccompCounts(r.Seccomp)); err != nil {
				return 0, false, err
			}
			ev.Event = &v1.TaskEvent_Seccomp{Seccomp: r.Seccomp}
		default:
			return 0, false, fmt.Errorf("report: record %d has no log line, update or seccomp totals: %w", first, errdefs.ErrInvalidArgument)
		}
		b, err := proto.Marshal(ev)
		if err != nil {
			return 0, false, err
		}
		batch = append(batch, b)
		if ev.GetState() != nil && running == nil {
			if err := flush(); err != nil {
				return 0, false, err
			}
		}
	}
	if err := flush(); err != nil {
		return 0, false, err
	}
	if err := settle(); err != nil {
		return 0, false, err
	}
	return acked, finished, nil
}

// seccompCounts turns an agent's seccomp totals into the store's.
func seccompCounts(s *v1.SeccompLogged) []store.SeccompCount {
	out := make([]store.SeccompCount, 0, len(s.GetSyscalls()))
	for _, c := range s.GetSyscalls() {
		out = append(out, store.SeccompCount{Syscall: c.GetSyscall(), Count: int64(min(c.GetCount(), math.MaxInt64))})
	}
	return out
}

// applyUpdate moves the attempt and task in Postgres (idempotent) and
// returns the event to publish and whether the attempt ended.
func (in *intake) applyUpdate(ctx context.Context, machineID, taskID string, n int, u *agentv1.AttemptUpdate, at time.Time) (*v1.StateChange, bool, error) {
	sc := &v1.StateChange{AttemptState: u.GetState(), MachineId: machineID, Message: u.GetMessage()}
	st, ok := attemptStateOf(u.GetState())
	switch {
	case !ok || st == store.AttemptScheduled:
		return nil, false, fmt.Errorf("report: attempt state %v is not one an agent reports: %w", u.GetState(), errdefs.ErrInvalidArgument)
	case st == store.AttemptRunning:
		// store writes RUNNING beside the stream append.
		return nil, false, fmt.Errorf("report %s/%d: RUNNING reached the update path", taskID, n)
	case st == store.AttemptLost:
		if lost := in.rescuer.loseQuiet(ctx, taskID, n, machineID, u.GetMessage()); lost != nil {
			return lost, true, nil
		}
		t, _, err := in.d.store.GetTask(ctx, "", taskID)
		if err != nil {
			return nil, false, err
		}
		sc.TaskState = taskStatePB(t.State)
		return sc, true, nil
	}
	reason, ok := reasonOf(u.GetReason())
	if !ok {
		return nil, false, fmt.Errorf("report: unknown failure reason %v: %w", u.GetReason(), errdefs.ErrInvalidArgument)
	}
	var exit *int
	if code := int(u.GetExitCode()); !reason.NotStarted() && (st != store.AttemptFailed || code != 0) {
		// A FAILED attempt with code 0 never ran its program (refused
		// before it started): it has no exit code either.
		exit = &code
	}
	e := store.AttemptEnd{State: st, ExitCode: exit, Message: u.GetMessage(), DroppedLines: int64(u.GetDroppedLines()),
		ImageDigest: u.GetImageDigest(), Reason: reason, Summary: u.GetSummary(), Result: resultOf(u.GetResult()), At: at}
	taskState, changed, err := in.d.store.EndAttempt(ctx, taskID, n, e)
	if err != nil {
		return nil, false, err
	}
	sc.Reason, sc.Summary = u.GetReason(), u.GetSummary()
	if !changed || taskState == "" {
		t, _, err := in.d.store.GetTask(ctx, "", taskID)
		if err != nil {
			return nil, false, err
		}
		taskState = t.State
	}
	sc.TaskState, sc.ExitCode = taskStatePB(taskState), exitCodePB(exit)
	if changed && taskState == store.TaskPending {
		// The machine could not start it: like a lost attempt, it goes
		// back to the queue for another machine.
		in.rescuer.requeueTask(ctx, taskID)
		sc.Message = fmt.Sprintf("attempt %d failed: %s; retrying", n, cmp.Or(u.GetSummary(), u.GetMessage()))
	}
	return sc, true, nil
}

// Running reconciles what an agent says it holds with what the controlplane
// placed on it: attempts it no longer holds are lost (once they had time to
// reach it), attempts it holds that are not wanted are returned to stop.
func (in *intake) Running(ctx context.Context, machineID string, running []*agentv1.RunningAttempt) ([]*agentv1.RunningAttempt, error) {
	active, err := in.d.store.ActiveAttempts(ctx, machineID)
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
		if !held[key{a.TaskID, a.Number}] && in.d.now().Sub(a.ScheduledAt) > dispatchMargin {
			in.rescuer.Lose(ctx, a.TaskID, a.Number, machineID, "the agent on machine "+machineID+" no longer runs it (it restarted)")
		}
	}
	var stop []*agentv1.RunningAttempt
	for _, r := range running {
		wanted, err := in.d.store.AttemptWanted(ctx, machineID, r.GetTaskId(), int(r.GetAttempt()))
		if err != nil {
			return nil, err
		}
		if !wanted {
			stop = append(stop, r)
		}
	}
	in.wake()
	return stop, nil
}
