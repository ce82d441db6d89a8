package tasks

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// maxResends is how often a push that found its machine's session closing
// is sent again on the machine's next session. A re-send is not a retry:
// RunTask is idempotent per attempt, and the attempt keeps its number.
const maxResends = 3

// resendBackoff is the first wait before a re-send (doubling after), long
// enough for an agent that was cut mid-push to have redialled.
const resendBackoff = 250 * time.Millisecond

// dispatch pushes a placed attempt to its agent. A push that fails because
// the machine's session went away (a reconnect racing the push: nothing
// says the agent got it) is sent again on the machine's current session,
// up to maxResends times within controlplane.lostAgentGrace. An agent that
// stays unreachable loses the attempt (which then uses a retry, as any lost
// attempt does), and one that refuses it fails the task (another machine
// would refuse it too). An attempt placed on an attached cluster's worker
// (clusterWorker, from the pass that placed it) gets the worker-wide
// security instead of the pool's. Nothing goes to the agent, nor to the
// followers, before announced is closed (the attempt's SCHEDULED is out).
func (s *Scheduler) dispatch(ctx context.Context, t store.Task, a store.Attempt, clusterWorker bool, announced <-chan struct{}) {
	ta, err := attemptFor(s.d.config, t, a)
	if err == nil && clusterWorker {
		ta.Security = WorkerWideSecurity(s.d.config, ta.Pool)
	}
	if err == nil {
		err = s.attachRegistryAuth(ctx, t, ta)
	}
	if err == nil {
		err = s.openSecrets(ctx, t, ta)
	}
	if err == nil {
		err = s.attachVolumes(ctx, t, ta)
	}
	if err == nil {
		err = s.attachBuild(ctx, t, ta)
	}
	if err == nil {
		err = s.attachInput(ctx, t, ta)
	}
	<-announced
	if err == nil {
		err = s.pushWithResends(ctx, t, a, ta)
	}
	if err == nil {
		return
	}
	if stopping(ctx) {
		s.d.log.Debug("push of an attempt cut by shutdown", "task_id", t.ID, "attempt", a.Number, "machine_id", a.MachineID)
		return
	}
	s.d.log.Warn("could not start an attempt on its machine", "task_id", t.ID, "attempt", a.Number, "machine_id", a.MachineID, "err", err)
	// The verdict is recorded even if the push's own time ran out.
	vctx, vcancel := context.WithTimeout(context.WithoutCancel(ctx), pushTimeout)
	defer vcancel()
	var gone *unrunnable
	if errors.As(err, &gone) {
		// Another machine could not open it either: the task fails.
		if ok, ferr := s.d.store.FinishAttempt(vctx, t.ID, a.Number, store.AttemptEnd{State: store.AttemptFailed,
			Message: gone.summary, Summary: gone.summary, At: s.d.now()}); ferr == nil && ok {
			s.events.publishState(vctx, t.ID, a.Number, &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_FAILED,
				AttemptState: v1.AttemptState_ATTEMPT_STATE_FAILED, MachineId: a.MachineID, Message: gone.summary, Summary: gone.summary})
			s.Wake()
		}
		return
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied:
		msg := "refused by machine " + a.MachineID + ": " + status.Convert(err).Message()
		code := -1
		if ok, ferr := s.d.store.FinishAttempt(vctx, t.ID, a.Number, store.AttemptEnd{State: store.AttemptFailed, ExitCode: &code,
			Message: msg, At: s.d.now()}); ferr == nil && ok {
			s.events.publishState(vctx, t.ID, a.Number, &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_FAILED,
				AttemptState: v1.AttemptState_ATTEMPT_STATE_FAILED, MachineId: a.MachineID, ExitCode: exitCodePB(&code), Message: msg})
			s.Wake()
		}
	default:
		s.lose(vctx, t.ID, a.Number, a.MachineID, "could not be started on machine "+a.MachineID+": "+err.Error())
	}
}

// pushWithResends sends RunTask, and again after a session loss while the
// grace lasts and the attempt is still wanted on its machine. Only calls
// that reached a session count against maxResends; while the machine has no
// session at all, or its agent answers that the session is not ready yet
// (errdefs.ReasonAgentNotReady), it waits for one (within the grace).
func (s *Scheduler) pushWithResends(ctx context.Context, t store.Task, a store.Attempt, ta *agentv1.TaskAttempt) error {
	deadline := s.d.now().Add(s.d.config.Controlplane.LostGrace())
	wait := resendBackoff
	for resends := 0; ; {
		sent, err := s.push(ctx, a.MachineID, ta)
		if err == nil || !sessionLost(err) || stopping(ctx) {
			return err
		}
		// An agent whose new session's first heartbeat is not yet answered
		// refuses with ReasonAgentNotReady: it got the push and asks for
		// it again, so that is not a push lost with a session.
		// Nor is a forwarded push no replica received (the one that held
		// the tunnel died; the agent comes back on another).
		if sent && !errdefs.HasReason(err, errdefs.ReasonAgentNotReady) && !errdefs.HasReason(err, errdefs.ReasonNotDelivered) {
			if resends == maxResends {
				return err
			}
			resends++
		}
		if s.d.now().Add(wait).After(deadline) {
			return err
		}
		s.d.log.Info("push met a closing session; sending again on the machine's next one", "task_id", t.ID, "attempt", a.Number,
			"machine_id", a.MachineID, "resend", resends, "reached_a_session", sent, "err", err)
		timer := s.d.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C():
		}
		wait = min(2*wait, 2*time.Second)
		wanted, werr := s.d.store.AttemptWanted(ctx, a.MachineID, t.ID, a.Number)
		if werr != nil {
			return errors.Join(err, werr)
		}
		if !wanted {
			return nil // cancelled or lost meanwhile: nothing to start
		}
	}
}

// push is one RunTask call on the machine's current session; sent is false
// when there was no session to call on.
func (s *Scheduler) push(ctx context.Context, machineID string, ta *agentv1.TaskAttempt) (sent bool, err error) {
	pctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	c, err := s.d.conn(pctx, machineID)
	if err != nil {
		return false, err
	}
	_, err = c.RunTask(pctx, &agentv1.RunTaskRequest{Attempt: ta})
	return true, err
}

// sessionLost reports whether a push failed because the machine's session
// was gone or went away under it, so the agent may not have seen it. A
// session that closes mid-call fails it with Canceled ("the client
// connection is closing"); the caller tells that from its own
// cancellation (stopping).
func sessionLost(err error) bool {
	return status.Code(err) == codes.Unavailable || status.Code(err) == codes.Canceled || errdefs.IsUnavailable(err)
}

// attachInput hands the task's input (kept apart from its spec) to the
// attempt; each attempt gets it again.
func (s *Scheduler) attachInput(ctx context.Context, t store.Task, ta *agentv1.TaskAttempt) error {
	if !t.HasInput {
		return nil
	}
	in, err := s.d.store.TaskInput(ctx, t.ID)
	if err != nil {
		return err
	}
	ta.Input = in
	return nil
}
