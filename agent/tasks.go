package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/levers9/levers9/agent/taskrun"
	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// attemptKey names an attempt on this agent.
type attemptKey struct {
	taskID  string
	attempt int32
}

func (k attemptKey) String() string { return fmt.Sprintf("%s/%d", k.taskID, k.attempt) }

// finishedMemory is how long, and finishedMax how many, attempts this
// agent finished are remembered, so a RunTask the controlplane repeats
// after the attempt ended (its first answer lost, a fast task) starts
// nothing.
const (
	finishedMemory = 15 * time.Minute
	finishedMax    = 4096
)

// held is one attempt the agent holds: from the RunTask that took it until
// its terminal record is acknowledged.
type held struct {
	key    attemptKey
	cancel context.CancelFunc
	q      *reportQueue
	// ended closes when the attempt's run returned: its container is
	// gone (or detached, when the agent stops).
	ended chan struct{}
	// cancelMu guards reason, the first reason the attempt was killed,
	// and lost, set when the lease killed it (it ends LOST, not CANCELLED:
	// the controlplane gave it up, and retries it when it may).
	cancelMu sync.Mutex
	reason   string
	lost     bool
}

func (h *held) kill(reason string) {
	h.cancelMu.Lock()
	if h.reason == "" {
		h.reason = reason
	}
	h.cancelMu.Unlock()
	h.cancel()
}

// killLost kills the attempt as lost (the lease ran out).
func (h *held) killLost(reason string) {
	h.cancelMu.Lock()
	if h.reason == "" {
		h.reason, h.lost = reason, true
	}
	h.cancelMu.Unlock()
	h.cancel()
}

func (h *held) killedLost() bool {
	h.cancelMu.Lock()
	defer h.cancelMu.Unlock()
	return h.lost
}

func (h *held) killReason() string {
	h.cancelMu.Lock()
	defer h.cancelMu.Unlock()
	return h.reason
}

// tasks runs attempts with the Runner and reports them: it is what the
// Agent service's RunTask, CancelTask and ListTasks and the heartbeat's
// running/stop fields act on.
//
// An attempt's life here:
//
//	RunTask ──> held (in ListTasks and heartbeats) ──> Run returns,
//	terminal record queued ──> terminal record acked ──> forgotten
//
// CancelTask, a heartbeat's stop and a report's stop=true end the kill
// context; the attempt still reports its terminal state.
type tasks struct {
	runner *taskrun.Runner
	send   reportFunc
	cfg    ReportConfig
	clock  clock.Clock
	log    *slog.Logger
	pool   string
	// floor is the machine's security minimum: attempts below it are
	// refused before anything starts.
	floor enroll.Floor
	// seccomp, when set, attributes seccomp log-mode records to attempts.
	seccomp *SeccompWatch
	// metrics counts starts and their latency (nil: not counted).
	metrics *Metrics
	// gate, when set, holds RunTask back until the session's first
	// heartbeat answer is applied.
	gate *sessionGate

	// mu guards the fields below.
	mu       sync.Mutex
	ctx      context.Context // ends on stop: reporters give up
	end      context.CancelFunc
	stopped  bool
	held     map[attemptKey]*held
	finished map[attemptKey]time.Time
	// lastBusy is when the agent last held an attempt (or started): the
	// idle exit counts from it.
	lastBusy time.Time
	wg       sync.WaitGroup
}

func newTasks(runner *taskrun.Runner, send reportFunc, cfg ReportConfig, clk clock.Clock, log *slog.Logger, pool string) *tasks {
	return &tasks{runner: runner, send: send, cfg: cfg, clock: clk, log: log, pool: pool,
		held: map[attemptKey]*held{}, finished: map[attemptKey]time.Time{}}
}

// start lets attempts run; the end of ctx (or stop) ends the reporters.
// The Runner is started by the caller, with its own shutdown context.
func (t *tasks) start(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx == nil && !t.stopped {
		t.ctx, t.end = context.WithCancel(ctx)
		t.lastBusy = t.clock.Now()
	}
}

// idleFor is how long the agent has held no attempt (0 while it holds one).
func (t *tasks) idleFor() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.held) > 0 || t.lastBusy.IsZero() {
		return 0
	}
	return t.clock.Now().Sub(t.lastBusy)
}

// stop refuses new attempts, ends the reporters, stops the Runner (running
// containers detach and keep running) and waits for every attempt
// goroutine. Safe twice and before start.
func (t *tasks) stop() {
	t.mu.Lock()
	t.stopped = true
	if t.end != nil {
		t.end()
	}
	t.mu.Unlock()
	t.runner.Stop()
	t.wg.Wait()
}

// run takes an attempt: it is held when run returns without error, and
// runs in the background. It waits for the gate (if any) first, bounded
// by ctx.
func (t *tasks) run(ctx context.Context, a *agentv1.TaskAttempt) (alreadyRunning bool, err error) {
	task, err := taskFromAttempt(a, t.pool)
	if err != nil {
		return false, err
	}
	if err := checkFloor(t.floor, task); err != nil {
		t.log.Warn("attempt refused: below this machine's security floor", "task_id", a.TaskId, "attempt", a.Attempt,
			"pool", task.Pool, "floor", t.floor.String(), "err", err, "audit", true)
		return false, err
	}
	key := attemptKey{a.TaskId, a.Attempt}
	if t.gate != nil {
		if err := t.gate.wait(ctx, "run task "+key.String()); err != nil {
			t.log.Info("attempt refused until the session's first heartbeat answer is applied", "task_id", a.TaskId, "attempt", a.Attempt)
			return false, err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx == nil || t.stopped || t.ctx.Err() != nil {
		return false, fmt.Errorf("run task %s: agent not started or stopping: %w", key, errdefs.ErrUnavailable)
	}
	if _, ok := t.held[key]; ok {
		return true, nil
	}
	if _, ok := t.finished[key]; ok {
		return true, nil
	}
	run := func(ctx context.Context, out taskrun.Output) (taskrun.Result, error) {
		return t.runner.Run(ctx, task, out)
	}
	if b := a.GetBuild(); b != nil {
		run = func(ctx context.Context, out taskrun.Output) (taskrun.Result, error) {
			return buildImage(ctx, t.runner, task, b, out)
		}
	}
	t.holdLocked(key, task, newReportQueue(t.cfg), run)
	return false, nil
}

// resume holds an attempt an earlier agent started and left running
// (taskrun.Runner.Recover found it): it goes on reporting from the record
// after the last one the controlplane acknowledged.
func (t *tasks) resume(rc taskrun.Recovered) error {
	key := attemptKey{rc.Task.ID, int32(rc.Task.Attempt)}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx == nil || t.stopped || t.ctx.Err() != nil {
		return fmt.Errorf("resume task %s: agent not started or stopping: %w", key, errdefs.ErrUnavailable)
	}
	if _, ok := t.held[key]; ok {
		return fmt.Errorf("resume task %s: %w", key, errdefs.ErrAlreadyExists)
	}
	t.holdLocked(key, rc.Task, resumedReportQueue(t.cfg, rc.Shipped), func(ctx context.Context, out taskrun.Output) (taskrun.Result, error) {
		return t.runner.Resume(ctx, rc, out)
	})
	return nil
}

// runFunc runs or resumes an attempt with the Runner.
type runFunc func(ctx context.Context, out taskrun.Output) (taskrun.Result, error)

// holdLocked holds an attempt and starts its reporter and its run.
func (t *tasks) holdLocked(key attemptKey, task taskrun.Task, q *reportQueue, run runFunc) {
	killCtx, cancel := context.WithCancel(context.WithoutCancel(t.ctx))
	h := &held{key: key, cancel: cancel, q: q, ended: make(chan struct{})}
	t.held[key] = h
	watched := t.seccomp.watch(task, h.q)
	t.wg.Add(2)
	log := t.log.With("task_id", key.taskID, "attempt", key.attempt, "pool", task.Pool)
	rep := &reporter{taskID: key.taskID, attempt: key.attempt, q: h.q, send: t.send, clock: t.clock, log: log,
		onStop: func() { h.kill("stopped by the controlplane") },
		onShipped: func(s taskrun.Shipped) {
			if err := t.runner.SaveShipped(key.taskID, int(key.attempt), s); err != nil {
				log.Warn("could not save how far the attempt's output was shipped", "err", err)
			}
		}}
	ctx := t.ctx
	go func() {
		defer t.wg.Done()
		rep.run(ctx)
		t.forget(h)
	}()
	go func() {
		defer t.wg.Done()
		defer close(h.ended)
		defer cancel()
		t.execute(killCtx, h, task, run, log, watched)
	}()
}

// execute runs the attempt and queues its records.
func (t *tasks) execute(ctx context.Context, h *held, task taskrun.Task, run runFunc, log *slog.Logger, watched bool) {
	var failMsg string
	taken, started := t.clock.Now(), false
	var applied *v1.AppliedSecurity
	out := taskrun.Output{
		Logs: taskrun.LogSinkFunc(func(_ context.Context, l taskrun.LogLine) error {
			h.q.pushLogAt(logRecord(l), lineEnd{stream: l.Stream, end: l.End})
			return nil
		}),
		Events: func(e taskrun.Event) {
			if e.Kind == taskrun.EventSecurity {
				// Sent before RUNNING; it travels with it, once.
				applied = appliedPB(e.Effective)
				return
			}
			if e.Kind != taskrun.EventState {
				return
			}
			switch e.To {
			case taskrun.StateRunning:
				started = true
				t.countStart(task.Pool, "started", t.clock.Since(taken))
				t.countPhases(task.Pool, e.Phases)
				h.q.pushRunning(&agentv1.AttemptRecord{Time: timestamppb.New(e.Time),
					Record: &agentv1.AttemptRecord_Update{Update: &agentv1.AttemptUpdate{State: v1.AttemptState_ATTEMPT_STATE_RUNNING,
						AppliedSecurity: applied}}})
			case taskrun.StateFailed:
				failMsg = e.Err
			}
		},
	}
	res, err := run(ctx, out)
	if errors.Is(err, taskrun.ErrDetached) || (err != nil && errdefs.IsUnavailable(err) && res.State == taskrun.StatePending) {
		// The agent is shutting down: the container (if any) keeps
		// running, and the next agent's Reconcile finds it.
		log.Info("attempt detached: agent shutting down")
		if watched {
			t.seccomp.forget(task.RunID())
		}
		return
	}
	if watched {
		// Its seccomp totals go before the terminal record.
		t.seccomp.finish(task.RunID())
	}
	if !started {
		t.countStart(task.Pool, "failed", 0)
	}
	u := &agentv1.AttemptUpdate{State: stateOf(res.State), ExitCode: int32(res.Exit.Code),
		DroppedLines: res.DroppedLines, ImageDigest: res.ImageDigest, Result: resultPB(res.Result)}
	switch res.State {
	case taskrun.StateFailed:
		// An exit code says it all; a message says why there is none.
		if err != nil || res.Exit.Code == 0 {
			u.Message = cmp.Or(failMsg, errString(err))
		}
		u.Reason, u.Summary = reasonPB(res.Reason), res.Summary
		if u.Message == "" {
			u.Message = res.Summary
		}
	case taskrun.StateCancelled:
		u.Message = cmp.Or(h.killReason(), "cancelled")
		if h.killedLost() {
			u.State = v1.AttemptState_ATTEMPT_STATE_LOST
		}
	case taskrun.StateTimedOut:
		u.Message = fmt.Sprintf("killed after the task's %s timeout", task.Timeout)
	default:
		if !res.State.Terminal() {
			u.State = v1.AttemptState_ATTEMPT_STATE_FAILED
			u.Message = cmp.Or(errString(err), fmt.Sprintf("attempt ended in state %s", res.State))
		}
	}
	h.q.pushTerminal(&agentv1.AttemptRecord{Time: timestamppb.New(t.clock.Now()), Record: &agentv1.AttemptRecord_Update{Update: u}})
	log.Info("attempt finished", "state", u.State.String(), "exit_code", u.ExitCode, "dropped_lines", u.DroppedLines,
		"reason", string(res.Reason), "err", u.Message)
}

// resultPB is the result file as the terminal update carries it; nil when
// the container left nothing.
func resultPB(r taskrun.ResultFile) *agentv1.AttemptResult {
	if !r.Present && r.Err == "" {
		return nil
	}
	return &agentv1.AttemptResult{Present: r.Present, Data: r.Data, Error: r.Err}
}

// countStart counts an attempt that started (with its latency) or never did.
func (t *tasks) countStart(pool, result string, latency time.Duration) {
	if t.metrics == nil {
		return
	}
	t.metrics.TaskStarts.WithLabelValues(pool, result).Inc()
	if result == "started" {
		t.metrics.TaskStartSeconds.WithLabelValues(pool).Observe(latency.Seconds())
	}
}

// countPhases records where a start's time went.
func (t *tasks) countPhases(pool string, phases []taskrun.Phase) {
	if t.metrics == nil {
		return
	}
	for _, p := range phases {
		t.metrics.TaskStartPhaseSeconds.WithLabelValues(pool, p.Name).Observe(p.Took.Seconds())
	}
}

// reasonsPB maps taskrun's failure reasons onto the API's.
var reasonsPB = map[taskrun.Reason]v1.FailureReason{
	taskrun.ReasonNone:            v1.FailureReason_FAILURE_REASON_UNSPECIFIED,
	taskrun.ReasonStartFailed:     v1.FailureReason_FAILURE_REASON_START_FAILED,
	taskrun.ReasonImageNotFound:   v1.FailureReason_FAILURE_REASON_IMAGE_NOT_FOUND,
	taskrun.ReasonImagePullFailed: v1.FailureReason_FAILURE_REASON_IMAGE_PULL_FAILED,
	taskrun.ReasonMountFailed:     v1.FailureReason_FAILURE_REASON_MOUNT_FAILED,
	taskrun.ReasonNetworkFailed:   v1.FailureReason_FAILURE_REASON_NETWORK_FAILED,
	taskrun.ReasonOutOfMemory:     v1.FailureReason_FAILURE_REASON_OUT_OF_MEMORY,
	taskrun.ReasonPidsLimit:       v1.FailureReason_FAILURE_REASON_PIDS_LIMIT,
}

func reasonPB(r taskrun.Reason) v1.FailureReason { return reasonsPB[r] }

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// forget drops an attempt whose terminal record is acknowledged (or whose
// reporter gave up because the agent stops).
func (t *tasks) forget(h *held) {
	done := h.q.done()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held[h.key] == h {
		delete(t.held, h.key)
		t.lastBusy = t.clock.Now()
	}
	if !done {
		return
	}
	now := t.clock.Now()
	for k, at := range t.finished {
		if now.Sub(at) > finishedMemory {
			delete(t.finished, k)
		}
	}
	if len(t.finished) >= finishedMax {
		var oldest attemptKey
		var at time.Time
		for k, v := range t.finished {
			if at.IsZero() || v.Before(at) {
				oldest, at = k, v
			}
		}
		delete(t.finished, oldest)
	}
	t.finished[h.key] = now
}

// cancel kills a held attempt; false when the agent does not hold it.
func (t *tasks) cancel(taskID string, attempt int32, reason string) bool {
	t.mu.Lock()
	h, ok := t.held[attemptKey{taskID, attempt}]
	t.mu.Unlock()
	if !ok {
		return false
	}
	h.kill(reason)
	return true
}

// stopAll kills the held attempts the controlplane listed and returns
// channels that close when each has ended.
func (t *tasks) stopAll(stop []*agentv1.RunningAttempt, reason string) []<-chan struct{} {
	var ended []<-chan struct{}
	for _, st := range stop {
		t.mu.Lock()
		h, ok := t.held[attemptKey{st.TaskId, st.Attempt}]
		t.mu.Unlock()
		if !ok {
			continue
		}
		h.kill(reason)
		t.log.Info("attempt stopped by the controlplane", "task_id", st.TaskId, "attempt", st.Attempt)
		ended = append(ended, h.ended)
	}
	return ended
}

// loseAll kills every held attempt as lost and returns how many it had
// not killed before.
func (t *tasks) loseAll(reason string) int {
	t.mu.Lock()
	hs := make([]*held, 0, len(t.held))
	for _, h := range t.held {
		hs = append(hs, h)
	}
	t.mu.Unlock()
	n := 0
	for _, h := range hs {
		if h.killReason() == "" {
			n++
		}
		h.killLost(reason)
	}
	return n
}

// list returns every held attempt, sorted.
func (t *tasks) list() []*agentv1.RunningAttempt {
	t.mu.Lock()
	keys := make([]attemptKey, 0, len(t.held))
	for k := range t.held {
		keys = append(keys, k)
	}
	t.mu.Unlock()
	slices.SortFunc(keys, func(a, b attemptKey) int {
		return cmp.Or(strings.Compare(a.taskID, b.taskID), cmp.Compare(a.attempt, b.attempt))
	})
	out := make([]*agentv1.RunningAttempt, len(keys))
	for i, k := range keys {
		out[i] = &agentv1.RunningAttempt{TaskId: k.taskID, Attempt: k.attempt}
	}
	return out
}
