package taskrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
)

// ErrDetached is returned by Run when the Runner's shutdown context ended
// while the container was running: the container keeps running and its
// network, rootfs and state stay (see the package doc).
var ErrDetached = errors.New("agent shutting down: task detached")

// Config configures a Runner. Zero durations and sizes take the defaults
// each field names.
type Config struct {
	Sandbox *sandbox.Sandbox
	Images  *image.Store
	// Egress attaches containers to the node's network; nil gives each
	// container a fresh namespace with only loopback.
	Egress *egress.Node
	// KillGrace is how long a killed container has between SIGTERM and
	// SIGKILL (default 10s).
	KillGrace time.Duration
	// LogBuffer is how many lines, and LogBufferBytes how many bytes of
	// text, each attempt queues for a slow sink before dropping the oldest
	// (defaults 4096 lines, 1 MiB); MaxLineBytes cuts longer lines (default
	// 16 KiB). Together they bound an attempt's log memory.
	LogBuffer      int
	LogBufferBytes int
	MaxLineBytes   int
	// DrainTimeout bounds how long an exited task waits for its sink to
	// take the queued lines (default 10s).
	DrainTimeout time.Duration
	// Volumes mounts task volumes on the node; nil refuses tasks with
	// volumes.
	Volumes VolumeMounter
	// Hooks, when set, makes more hooks for each attempt; they run after
	// the built-in image, network and logs hooks (and Stop before them).
	Hooks func(Task) []Hook
	// StateDir, when set, holds a record of every attempt whose container
	// is started and not yet cleaned up (0700, one JSON file each), so
	// Reconcile can report what an earlier agent lost. The agent puts it
	// under its own state directory.
	StateDir string
	// IODir, when set, holds each task attempt's io directory (its run ID,
	// bound at IOPath; see the io hook), so a restarted agent still reads
	// a resumed attempt's result. The agent puts it under its state
	// directory. Without it a task with input is refused and none has a
	// result.
	IODir string
	// MaxResultBytes bounds the result an attempt may leave (default
	// DefaultMaxResultBytes); a larger one is reported as too large.
	MaxResultBytes int
	Logger         *slog.Logger
	// Clock times timeouts and grace periods and stamps log lines
	// (default the wall clock).
	Clock clock.Clock
}

func (c Config) withDefaults() Config {
	if c.KillGrace == 0 {
		c.KillGrace = 10 * time.Second
	}
	if c.LogBuffer == 0 {
		c.LogBuffer = 4096
	}
	if c.LogBufferBytes == 0 {
		c.LogBufferBytes = 1 << 20
	}
	if c.MaxLineBytes == 0 {
		c.MaxLineBytes = 16 << 10
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = DefaultMaxResultBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Clock = clock.OrReal(c.Clock)
	return c
}

// Validate reports every problem at once, each naming its field.
func (c Config) Validate() error {
	var errs []error
	if c.Sandbox == nil {
		errs = append(errs, errors.New("taskrun.sandbox: nil"))
	}
	if c.Images == nil {
		errs = append(errs, errors.New("taskrun.images: nil"))
	}
	if c.KillGrace < 0 {
		errs = append(errs, fmt.Errorf("taskrun.killGrace: %v is negative", c.KillGrace))
	}
	if c.LogBuffer < 0 {
		errs = append(errs, fmt.Errorf("taskrun.logBuffer: %d is negative", c.LogBuffer))
	}
	if c.LogBufferBytes < 0 {
		errs = append(errs, fmt.Errorf("taskrun.logBufferBytes: %d is negative", c.LogBufferBytes))
	}
	if c.MaxLineBytes < 0 {
		errs = append(errs, fmt.Errorf("taskrun.maxLineBytes: %d is negative", c.MaxLineBytes))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("taskrun.drainTimeout: %v is negative", c.DrainTimeout))
	}
	if c.StateDir != "" && !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("taskrun.stateDir: %q is not absolute", c.StateDir))
	}
	if c.IODir != "" && !filepath.IsAbs(c.IODir) {
		errs = append(errs, fmt.Errorf("taskrun.ioDir: %q is not absolute", c.IODir))
	}
	if c.MaxResultBytes < 0 {
		errs = append(errs, fmt.Errorf("taskrun.maxResultBytes: %d is negative", c.MaxResultBytes))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, errors.Join(errs...))
}

// Runner runs task attempts on this node. Run may be called concurrently
// for different attempts; it blocks for the attempt's whole life.
//
// Start(ctx) opens the Runner; ctx is the shutdown context. Stop ends it:
// every running attempt detaches (Run returns ErrDetached, containers keep
// running) and Stop blocks until every Run returned. Stop is safe twice
// and before Start; Run outside Start..Stop is refused.
type Runner struct {
	cfg    Config
	logger *slog.Logger

	// mu guards the fields below.
	mu       sync.Mutex
	shutdown context.Context
	cancel   context.CancelFunc
	stopped  bool
	active   sync.WaitGroup
	running  int
	// attempts are the attempts inside Run, by runID.
	attempts map[string]*attempt
}

// Images is the node's image cache the Runner pulls through.
func (r *Runner) Images() *image.Store { return r.cfg.Images }

// AttemptInfo describes an attempt this Runner is running, for the agent
// to tell the controlplane on (re)connect what it runs.
type AttemptInfo struct {
	TaskID      string
	Attempt     int
	State       State
	ContainerID string
}

// Attempts lists the attempts inside Run, sorted by task and attempt.
// Safe to call concurrently with Run.
func (r *Runner) Attempts() []AttemptInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]AttemptInfo, 0, len(r.attempts))
	for _, a := range r.attempts {
		out = append(out, AttemptInfo{TaskID: a.task.ID, Attempt: a.task.Attempt, State: a.currentState(), ContainerID: a.cid})
	}
	slices.SortFunc(out, func(x, y AttemptInfo) int {
		if c := strings.Compare(x.TaskID, y.TaskID); c != 0 {
			return c
		}
		return x.Attempt - y.Attempt
	})
	return out
}

// New checks cfg and returns a Runner that is not started.
func New(cfg Config) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Runner{cfg: cfg, logger: cfg.Logger.With("component", "taskrun")}, nil
}

// Start implements the loop contract; ctx is the shutdown context.
func (r *Runner) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return fmt.Errorf("start task runner: stopped: %w", errdefs.ErrFailedPrecondition)
	}
	if r.shutdown == nil {
		r.shutdown, r.cancel = context.WithCancel(ctx)
	}
	return nil
}

// Stop implements the loop contract.
func (r *Runner) Stop() {
	r.mu.Lock()
	r.stopped = true
	if r.cancel != nil {
		r.cancel()
	}
	r.mu.Unlock()
	r.active.Wait()
}

// enter registers a Run; the same attempt twice is refused, so a
// controlplane that repeats a start never runs it twice.
func (r *Runner) enter(a *attempt) (context.Context, func(), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shutdown == nil || r.stopped || r.shutdown.Err() != nil {
		return nil, nil, errdefs.WithRetry(fmt.Errorf("task runner not started or stopping: %w", errdefs.ErrUnavailable), true)
	}
	id := a.task.runID()
	if _, ok := r.attempts[id]; ok {
		return nil, nil, errdefs.WithRetry(fmt.Errorf("already running: %w", errdefs.ErrAlreadyExists), false)
	}
	if r.attempts == nil {
		r.attempts = map[string]*attempt{}
	}
	r.attempts[id] = a
	r.active.Add(1)
	r.running++
	return r.shutdown, func() {
		r.mu.Lock()
		r.running--
		delete(r.attempts, id)
		r.mu.Unlock()
		r.active.Done()
	}, nil
}

// Lost is an attempt an earlier agent started and Reconcile removed: the
// agent reports it to the controlplane (its outcome is unknown).
type Lost struct {
	TaskID      string
	Attempt     int
	Pool        string
	ContainerID string
	Started     time.Time
}

// Reconcile removes what an earlier agent (or a killed test) left: every
// container, task rootfs and network namespace of ours, and returns the
// attempts it found records of (Config.StateDir). Reattaching is future
// work, so containers a detached agent left running are killed. It refuses
// to run while this Runner runs attempts.
func (r *Runner) Reconcile(ctx context.Context) ([]Lost, error) {
	r.mu.Lock()
	busy := r.running
	r.mu.Unlock()
	if busy > 0 {
		return nil, fmt.Errorf("reconcile tasks: %d attempts running: %w", busy, errdefs.ErrFailedPrecondition)
	}
	var errs []error
	recs, names, err := r.records().list()
	if err != nil {
		// A torn record names no attempt to report; it goes with the rest.
		r.logger.Warn("unreadable attempt records", "err", err)
	}
	lost := make([]Lost, 0, len(recs))
	for _, rec := range recs {
		lost = append(lost, Lost{TaskID: rec.TaskID, Attempt: rec.Attempt, Pool: rec.Pool, ContainerID: rec.ContainerID, Started: rec.Started})
	}
	if err := r.cfg.Sandbox.Reconcile(ctx); err != nil {
		errs = append(errs, fmt.Errorf("reconcile containers: %w", err))
	}
	if err := r.cfg.Images.Reconcile(ctx, nil); err != nil {
		errs = append(errs, fmt.Errorf("reconcile rootfs mounts: %w", err))
	}
	if r.cfg.Egress != nil {
		if err := r.cfg.Egress.Reconcile(ctx, nil); err != nil {
			errs = append(errs, fmt.Errorf("reconcile networks: %w", err))
		}
	}
	if len(errs) == 0 {
		// Records go only once what they describe is gone.
		for _, n := range names {
			if err := r.records().remove(n); err != nil {
				errs = append(errs, err)
			}
		}
		if err := removeIODirs(r.cfg.IODir, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return lost, errors.Join(errs...)
}

func (r *Runner) records() records { return records{dir: r.cfg.StateDir} }

// Output is where an attempt reports: its log lines and its events.
type Output struct {
	// Logs receives the output lines; nil discards them.
	Logs LogSink
	// Events is called synchronously, in order, from Run's goroutine; it
	// must not block for long. Nil ignores events.
	Events func(Event)
}

// Result is how an attempt ended.
type Result struct {
	State State
	// Exit is the container's exit (zero value when it never ran).
	Exit sandbox.ExitStatus
	// Effective is the security the runtime really applied (nil when the
	// container never started).
	Effective *sandbox.Effective
	// ImageDigest is the image that ran.
	ImageDigest  string
	DroppedLines uint64
	// Reason says why a FAILED attempt failed when Exit does not (the
	// program never ran, or a limit killed it); Summary says it in one
	// sentence for people.
	Reason  Reason
	Summary string
	// Result is what the container left in IOPath/result (zero when it
	// never ran, or the Runner has no IODir).
	Result ResultFile
}

// Run runs one attempt to its end and returns how it ended. ctx is the
// kill context: its end kills the container (CANCELLED). An error comes
// with a FAILED result when the attempt could not start (bad task, pull
// or runtime failure; errdefs.IsRetryable says whether another attempt may
// succeed), or ErrDetached when the Runner stopped while it ran. A task
// that ran and exited non-zero is FAILED with a nil error.
func (r *Runner) Run(ctx context.Context, t Task, out Output) (Result, error) {
	a := newAttempt(r, t, out)
	if err := t.Validate(); err != nil {
		a.fail(err)
		return a.result(), err
	}
	shutdown, release, err := r.enter(a)
	if err != nil {
		return a.result(), fmt.Errorf("task %s attempt %d: %w", t.ID, t.Attempt, err)
	}
	defer release()
	return a.run(ctx, shutdown)
}
