package taskrun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
)

// Recovered is an attempt an earlier agent started whose container is
// still there (running, or exited with its status recorded): Resume goes
// on with it.
type Recovered struct {
	Task        Task
	ImageDigest string
	Started     time.Time
	// Shipped is how far the earlier agent's reports reached.
	Shipped Shipped
}

// SaveShipped records how far an attempt's reports reached the
// controlplane, so a restarted agent resumes there (Recover). The agent
// calls it after each acknowledgement; it does nothing once the attempt
// was cleaned up.
func (r *Runner) SaveShipped(taskID string, attempt int, s Shipped) error {
	return r.records().saveShipped(Task{ID: taskID, Attempt: attempt}.runID(), s)
}

// Recover is Reconcile for an agent that restarts while its containers
// run: the attempts whose records and containers both survived are kept
// (their containers, rootfs mounts and network namespaces stay) and
// returned for Resume; everything else of ours is removed, and the
// attempts it had records of are returned as lost. It refuses to run
// while this Runner runs attempts.
func (r *Runner) Recover(ctx context.Context) ([]Recovered, []Lost, error) {
	r.mu.Lock()
	busy := r.running
	r.mu.Unlock()
	if busy > 0 {
		return nil, nil, fmt.Errorf("recover tasks: %d attempts running: %w", busy, errdefs.ErrFailedPrecondition)
	}
	recs, names, err := r.records().list()
	if err != nil {
		r.logger.Warn("unreadable attempt records", "err", err)
	}
	var (
		found    []Recovered
		lost     []Lost
		keep     []string
		live     []egress.ContainerNet
		keptName = map[string]bool{}
	)
	for _, rec := range recs {
		t := Task{ID: rec.TaskID, Attempt: rec.Attempt, Pool: rec.Pool, Image: rec.ImageDigest,
			Timeout: rec.Timeout, Resources: rec.Resources, Network: rec.Network}
		id := t.runID()
		if !r.cfg.Sandbox.Left(id) {
			lost = append(lost, Lost{TaskID: rec.TaskID, Attempt: rec.Attempt, Pool: rec.Pool, ContainerID: rec.ContainerID, Started: rec.Started})
			continue
		}
		found = append(found, Recovered{Task: t, ImageDigest: rec.ImageDigest, Started: rec.Started, Shipped: r.records().shipped(id)})
		keep, keptName[id] = append(keep, id), true
		live = append(live, egress.ContainerNet{ID: r.cfg.Sandbox.ContainerID(id), Task: t.ID, Pool: t.Pool, Security: t.Network})
	}
	var errs []error
	if err := r.cfg.Sandbox.ReconcileExcept(ctx, keep); err != nil {
		errs = append(errs, fmt.Errorf("reconcile containers: %w", err))
	}
	if err := r.cfg.Images.Reconcile(ctx, keep); err != nil {
		errs = append(errs, fmt.Errorf("reconcile rootfs mounts: %w", err))
	}
	if r.cfg.Egress != nil {
		if err := r.cfg.Egress.Reconcile(ctx, live); err != nil {
			errs = append(errs, fmt.Errorf("reconcile networks: %w", err))
		}
	}
	if len(errs) == 0 {
		for _, n := range names {
			if !keptName[n] {
				if err := r.records().remove(n); err != nil {
					errs = append(errs, err)
				}
			}
		}
		r.removeStrayShipped(keptName)
		if err := removeIODirs(r.cfg.IODir, keptName); err != nil {
			errs = append(errs, err)
		}
	}
	return found, lost, errors.Join(errs...)
}

// removeStrayShipped removes offsets files whose record is gone.
func (r *Runner) removeStrayShipped(kept map[string]bool) {
	if r.cfg.StateDir == "" {
		return
	}
	ents, _ := os.ReadDir(r.cfg.StateDir)
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), shippedSuffix); ok && !kept[n] {
			_ = os.Remove(filepath.Join(r.cfg.StateDir, e.Name()))
		}
	}
}

// Resume goes on with an attempt Recover found, as Run would from its
// RUNNING state on: its output is read from the files from the shipped
// offsets on, its timeout counts from when it started, and it ends,
// is killed or detaches like any attempt. Its RUNNING event is sent
// again; the caller knows whether it was shipped.
func (r *Runner) Resume(ctx context.Context, rc Recovered, out Output) (Result, error) {
	t := rc.Task
	if t.Timeout > 0 {
		t.Timeout = max(t.Timeout-r.cfg.Clock.Since(rc.Started), time.Millisecond)
	}
	a := newAttempt(r, t, out)
	a.logs.from = rc.Shipped
	a.res.ImageDigest = rc.ImageDigest
	shutdown, release, err := r.enter(a)
	if err != nil {
		return a.result(), fmt.Errorf("task %s attempt %d: %w", t.ID, t.Attempt, err)
	}
	defer release()
	id := t.runID()
	a.image.adopt(func() error { return r.cfg.Images.Unmount(id) })
	var resp PrestartResponse
	if err := a.logs.Prestart(ctx, &PrestartRequest{Task: t, ContainerID: a.cid}, &resp); err != nil {
		return a.result(), err
	}
	h, err := r.cfg.Sandbox.Reattach(ctx, id, sandbox.ReattachOpts{Stdout: resp.Stdout, Stderr: resp.Stderr,
		StdoutOffset: rc.Shipped.Stdout, StderrOffset: rc.Shipped.Stderr})
	if err != nil {
		a.stopHooks()
		_ = r.records().remove(id)
		err = fmt.Errorf("task %s attempt %d: the container could not be reattached after the agent restarted: %w", t.ID, t.Attempt, err)
		a.res.Reason, a.res.Summary = ReasonOf(startReason(err))
		a.fail(err)
		return a.result(), err
	}
	a.logger.Info("attempt resumed after an agent restart", "container_id", h.ID,
		"shipped_seq", rc.Shipped.Seq, "stdout_offset", rc.Shipped.Stdout, "stderr_offset", rc.Shipped.Stderr)
	// The earlier agent took it through PULLING and STARTING.
	a.stateMu.Lock()
	a.state = StateStarting
	a.stateMu.Unlock()
	return a.running(ctx, shutdown, h)
}
