package taskrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
)

// cleanupTimeout bounds deleting a container and its hooks' teardown,
// which run on a context that no longer carries the kill.
const cleanupTimeout = time.Minute

// attempt is one Run: its state, hooks and outputs.
type attempt struct {
	r      *Runner
	task   Task
	out    Output
	logger *slog.Logger
	cid    string

	// stateMu guards state, which Attempts reads from other goroutines;
	// only Run's goroutine writes it.
	stateMu sync.Mutex
	state   State

	// Only Run's goroutine touches the fields below.
	image   *imageHook
	network *networkHook
	logs    *logsHook
	hooks   []Hook
	res     Result
	phases  []Phase
}

func newAttempt(r *Runner, t Task, out Output) *attempt {
	sink := out.Logs
	if sink == nil {
		sink = LogSinkFunc(func(context.Context, LogLine) error { return nil })
	}
	a := &attempt{r: r, task: t, out: out, state: StatePending,
		cid:    r.cfg.Sandbox.ContainerID(t.runID()),
		logger: r.logger.With("task_id", t.ID, "attempt", t.Attempt, "pool", t.Pool)}
	a.image = newImageHook(r.cfg.Images)
	a.network = newNetworkHook(r.cfg.Egress)
	a.logs = &logsHook{sink: sink, capacity: r.cfg.LogBuffer, maxBytes: r.cfg.LogBufferBytes, maxLine: r.cfg.MaxLineBytes,
		drainTimeout: r.cfg.DrainTimeout, clock: r.cfg.Clock, logger: a.logger}
	a.hooks = []Hook{a.image, a.network, &volumeHook{mounter: r.cfg.Volumes}, newIOHook(r.cfg.IODir, t, r.cfg.MaxResultBytes), a.logs}
	if r.cfg.Hooks != nil {
		a.hooks = append(a.hooks, r.cfg.Hooks(t)...)
	}
	return a
}

func (a *attempt) emit(e Event) {
	if a.out.Events == nil {
		return
	}
	e.TaskID, e.Attempt, e.Time = a.task.ID, a.task.Attempt, a.r.cfg.Clock.Now()
	a.out.Events(e)
}

// to moves the attempt's state; an illegal move is a bug in this package
// and is logged, not made.
func (a *attempt) to(s State, cause error) {
	next, err := a.state.Next(s)
	if err != nil {
		a.logger.Error("refused state change", "err", err)
		return
	}
	e := Event{Kind: EventState, From: a.state, To: next}
	if next == StateRunning {
		e.Phases = a.phases
	}
	if cause != nil {
		e.Err = cause.Error()
	}
	a.stateMu.Lock()
	a.state = next
	a.stateMu.Unlock()
	a.logger.Info("task state", "from", string(e.From), "to", string(next))
	a.emit(e)
}

func (a *attempt) fail(err error) { a.to(StateFailed, err) }

func (a *attempt) currentState() State {
	a.stateMu.Lock()
	defer a.stateMu.Unlock()
	return a.state
}

func (a *attempt) result() Result {
	a.res.State = a.state
	a.res.DroppedLines = a.logs.dropped()
	return a.res
}

// run drives the attempt; shutdown is the Runner's shutdown context.
func (a *attempt) run(ctx, shutdown context.Context) (Result, error) {
	// Starting ends on a kill or a shutdown alike: nothing runs yet.
	startCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopStart := context.AfterFunc(shutdown, cancel)
	defer stopStart()

	a.to(StatePulling, nil)
	resp, err := a.prestart(startCtx)
	if err == nil {
		a.to(StateStarting, nil)
		var h *sandbox.Handle
		if h, err = a.start(startCtx, resp); err == nil {
			return a.running(ctx, shutdown, h)
		}
	}
	a.stopHooks()
	switch {
	case ctx.Err() != nil:
		a.to(StateCancelled, nil)
		return a.result(), nil
	case shutdown.Err() != nil:
		return a.result(), fmt.Errorf("task %s attempt %d: %w", a.task.ID, a.task.Attempt, ErrDetached)
	}
	err = fmt.Errorf("task %s attempt %d: %w", a.task.ID, a.task.Attempt, err)
	a.res.Reason, a.res.Summary = ReasonOf(err)
	a.fail(err)
	return a.result(), err
}

// prestart runs the hooks' Prestart and merges their responses in hook
// order. The hooks that read neither the image nor its rootfs
// (besideImage: the image hook, which makes them, among them) run at the
// same time: a pull overlaps a volume mount and the network attachment.
// The rest run after them, one by one.
func (a *attempt) prestart(ctx context.Context) (*PrestartResponse, error) {
	req := &PrestartRequest{Task: a.task, ContainerID: a.cid}
	var first, rest []Prestarter
	for _, h := range a.hooks {
		p, ok := h.(Prestarter)
		if !ok {
			continue
		}
		if _, free := h.(besideImage); free {
			first = append(first, p)
			continue
		}
		rest = append(rest, p)
	}
	resps, err := a.prestartTogether(ctx, req, first)
	if err != nil {
		return nil, err
	}
	merged := &PrestartResponse{}
	for i := range resps {
		merge(merged, req, &resps[i])
	}
	for _, p := range rest {
		var resp PrestartResponse
		began := a.r.cfg.Clock.Now()
		if err := p.Prestart(ctx, req, &resp); err != nil {
			return nil, fmt.Errorf("prestart %s: %w", p.Name(), err)
		}
		a.phases = append(a.phases, Phase{p.Name(), a.r.cfg.Clock.Since(began)})
		merge(merged, req, &resp)
	}
	if merged.Image == nil || merged.Rootfs == "" {
		return nil, errors.New("prestart: no hook provided the image rootfs")
	}
	a.res.ImageDigest = merged.Image.Digest
	return merged, nil
}

// prestartTogether runs hooks' Prestart at once, each with its own copy of
// req, and returns once all have: the first failure cancels the others
// and is the one returned. Each hook's phase is its own time.
func (a *attempt) prestartTogether(ctx context.Context, req *PrestartRequest, hooks []Prestarter) ([]PrestartResponse, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	resps := make([]PrestartResponse, len(hooks))
	took := make([]time.Duration, len(hooks))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for i, p := range hooks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := *req
			began := a.r.cfg.Clock.Now()
			err := p.Prestart(ctx, &r, &resps[i])
			took[i] = a.r.cfg.Clock.Since(began)
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("prestart %s: %w", p.Name(), err)
					cancel(firstErr)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	for i, p := range hooks {
		a.phases = append(a.phases, Phase{p.Name(), took[i]})
	}
	return resps, nil
}

// merge folds one hook's response into merged; later hooks see the image
// and rootfs in req.
func merge(merged *PrestartResponse, req *PrestartRequest, resp *PrestartResponse) {
	if resp.Image != nil {
		merged.Image, req.Image = resp.Image, resp.Image
	}
	if resp.Rootfs != "" {
		merged.Rootfs, req.Rootfs = resp.Rootfs, resp.Rootfs
	}
	if resp.NetNSPath != "" {
		merged.NetNSPath = resp.NetNSPath
	}
	if resp.EgressMode != "" {
		merged.EgressMode = resp.EgressMode
	}
	merged.Mounts = append(merged.Mounts, resp.Mounts...)
	if resp.Stdout != nil {
		merged.Stdout, merged.Stderr = resp.Stdout, resp.Stderr
	}
}

// spec builds the sandbox task from the image and the hooks' responses.
func (a *attempt) spec(resp *PrestartResponse) sandbox.TaskSpec {
	cfg := resp.Image.Config
	args := append([]string{}, cfg.Entrypoint...)
	if a.task.Build != nil {
		args = append([]string{}, a.task.Args...)
	} else if len(a.task.Args) > 0 {
		args = append(args, a.task.Args...)
	} else {
		args = append(args, cfg.Cmd...)
	}
	cwd := a.task.Cwd
	if cwd == "" {
		cwd = cfg.WorkingDir
	}
	return sandbox.TaskSpec{
		ID: a.task.runID(), Rootfs: resp.Rootfs, Args: args,
		Env: mergeEnv(cfg.Env, a.task.Env), SecretEnv: a.task.SecretEnv,
		User: a.task.User, ImageUser: cfg.User, Cwd: cwd,
		Hostname: a.task.ID, Resources: a.task.Resources, GPUs: a.task.gpuSpec(),
		AgentMounts: resp.Mounts, NetNSPath: resp.NetNSPath,
	}
}

// mergeEnv returns base with over's keys replaced or appended, in order.
func mergeEnv(base, over []string) []string {
	out := append([]string{}, base...)
	idx := map[string]int{}
	for i, kv := range out {
		k, _, _ := strings.Cut(kv, "=")
		idx[k] = i
	}
	for _, kv := range over {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

func (a *attempt) start(ctx context.Context, resp *PrestartResponse) (*sandbox.Handle, error) {
	h, err := a.r.cfg.Sandbox.Run(ctx, a.spec(resp), a.task.Security, sandbox.Stdio{Stdout: resp.Stdout, Stderr: resp.Stderr})
	if err != nil {
		err = fmt.Errorf("start container: %w", err)
		if errdefs.IsInvalidArgument(err) || errdefs.IsPermissionDenied(err) {
			// The task or its volumes were refused: not the machine's fault.
			return nil, err
		}
		return nil, startReason(err)
	}
	a.phases = append(a.phases, Phase{"prepare", h.Timing.Prepare}, Phase{"create", h.Timing.Create}, Phase{"start", h.Timing.Start})
	rec := record{TaskID: a.task.ID, Attempt: a.task.Attempt, Pool: a.task.Pool, ContainerID: h.ID,
		ImageDigest: resp.Image.Digest, Started: a.r.cfg.Clock.Now(),
		Timeout: a.task.Timeout, Resources: a.task.Resources, Network: a.task.Network}
	if err := a.r.records().save(a.task.runID(), rec); err != nil {
		// Without the record a restarted agent could not report this
		// attempt; better not to run it.
		_ = h.Delete(context.WithoutCancel(ctx))
		return nil, err
	}
	eff := h.Effective
	if resp.EgressMode != "" {
		eff.EgressMode = resp.EgressMode
	}
	a.res.Effective = &eff
	a.emit(Event{Kind: EventSecurity, Effective: &eff})
	return h, nil
}

type waitResult struct {
	exit sandbox.ExitStatus
	err  error
}

// running waits for the container to exit, be killed or be left behind.
func (a *attempt) running(ctx, shutdown context.Context, h *sandbox.Handle) (Result, error) {
	a.to(StateRunning, nil)
	for _, hk := range a.hooks {
		if p, ok := hk.(Poststarter); ok {
			if err := p.Poststart(ctx, &PoststartRequest{Task: a.task, Container: h.ID, Effective: h.Effective}); err != nil {
				a.logger.Warn("poststart hook failed", "hook", hk.Name(), "err", err)
			}
		}
	}
	waitCtx, stopWait := context.WithCancel(context.Background())
	defer stopWait()
	waited := make(chan waitResult, 1)
	go func() {
		st, err := h.Wait(waitCtx)
		waited <- waitResult{st, err}
	}()
	var timeout <-chan time.Time
	if a.task.Timeout > 0 {
		timeout = a.r.cfg.Clock.After(a.task.Timeout)
	}
	final := StateSucceeded
	var w waitResult
	select {
	case w = <-waited:
	case <-ctx.Done():
		final = StateCancelled
		w = a.kill(h, waited, final)
	case <-timeout:
		final = StateTimedOut
		w = a.kill(h, waited, final)
	case <-shutdown.Done():
		// Leave the container, its network and rootfs; only our own
		// goroutines end.
		_ = a.logs.Stop(context.Background(), &StopRequest{Task: a.task, ContainerID: a.cid})
		a.logger.Info("agent shutting down; container left running", "container_id", h.ID)
		return a.result(), fmt.Errorf("task %s attempt %d: %w", a.task.ID, a.task.Attempt, ErrDetached)
	}
	if w.err != nil {
		a.logger.Warn("wait for container", "container_id", h.ID, "err", w.err)
	}
	a.res.Exit = w.exit
	if kills, err := h.LimitKills(); err == nil {
		a.res.Reason, a.res.Summary = limitReason(kills, a.task.Resources)
	} else {
		a.logger.Debug("no cgroup events to read", "container_id", h.ID, "err", err)
	}
	a.emit(Event{Kind: EventExited, Exit: &w.exit})
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var exited ExitedResponse
	for _, hk := range a.hooks {
		if e, ok := hk.(Exiter); ok {
			var resp ExitedResponse
			if err := e.Exited(cctx, &ExitedRequest{Task: a.task, Exit: w.exit}, &resp); err != nil {
				a.logger.Warn("exited hook failed", "hook", hk.Name(), "err", err)
			}
			exited.DroppedLines += resp.DroppedLines
			if resp.Result != nil {
				a.res.Result = *resp.Result
			}
		}
	}
	if exited.DroppedLines > 0 {
		a.emit(Event{Kind: EventDroppedLines, DroppedLines: exited.DroppedLines})
	}
	if err := h.Delete(cctx); err != nil {
		a.logger.Error("delete container", "container_id", h.ID, "err", err)
	}
	a.stopHooks()
	if err := a.r.records().remove(a.task.runID()); err != nil {
		a.logger.Error("remove attempt record", "err", err)
	}
	if final == StateSucceeded && (w.err != nil || w.exit.Code != 0) {
		final = StateFailed
	}
	var cause error
	if final == StateFailed && w.err != nil {
		// The runtime failed, not the program.
		cause = startReason(w.err)
		a.res.Reason, a.res.Summary = ReasonOf(cause)
	}
	a.to(final, cause)
	return a.result(), nil
}

// kill sends SIGTERM, then SIGKILL after the grace period, and waits for
// the exit.
func (a *attempt) kill(h *sandbox.Handle, waited <-chan waitResult, reason State) waitResult {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for _, hk := range a.hooks {
		if p, ok := hk.(Prekiller); ok {
			if err := p.Prekill(ctx, &PrekillRequest{Task: a.task, Container: h.ID, Reason: reason}); err != nil {
				a.logger.Warn("prekill hook failed", "hook", hk.Name(), "err", err)
			}
		}
	}
	if err := h.Kill(ctx, syscall.SIGTERM); err != nil {
		a.logger.Warn("SIGTERM container", "container_id", h.ID, "err", err)
	}
	select {
	case w := <-waited:
		return w
	case <-a.r.cfg.Clock.After(a.r.cfg.KillGrace):
	}
	if err := h.Kill(ctx, syscall.SIGKILL); err != nil {
		a.logger.Warn("SIGKILL container", "container_id", h.ID, "err", err)
	}
	select {
	case w := <-waited:
		return w
	case <-ctx.Done():
		// Delete forces it.
		return waitResult{exit: sandbox.ExitStatus{Code: 128 + int(syscall.SIGKILL), Signal: syscall.SIGKILL}, err: ctx.Err()}
	}
}

// stopHooks runs every Stop hook in reverse order.
func (a *attempt) stopHooks() {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for i := len(a.hooks) - 1; i >= 0; i-- {
		if s, ok := a.hooks[i].(Stopper); ok {
			if err := s.Stop(ctx, &StopRequest{Task: a.task, ContainerID: a.cid}); err != nil {
				a.logger.Error("stop hook failed", "hook", a.hooks[i].Name(), "err", err)
			}
		}
	}
}
