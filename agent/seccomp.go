package agent

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/levers9/levers9/agent/taskrun"
	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/sandbox"
)

// SeccompObserver is told of every seccomp log-mode record attributed to
// a task: the syscall enforce would have refused. It is called from the
// kernel log reader's goroutine and must not block (a counter increment).
type SeccompObserver interface {
	SeccompLogged(pool, task, syscall string)
}

// SeccompObserverFunc adapts a function to SeccompObserver.
type SeccompObserverFunc func(pool, task, syscall string)

// SeccompLogged implements SeccompObserver.
func (f SeccompObserverFunc) SeccompLogged(pool, task, syscall string) { f(pool, task, syscall) }

// DefaultSeccompFlush is how often an attempt's seccomp totals are sent
// while they change.
const DefaultSeccompFlush = 5 * time.Second

// seccompSettle is how long an attempt's end waits for the kernel log
// reader to handle records already written (kauditd prints them
// asynchronously).
const seccompSettle = 200 * time.Millisecond

// SeccompWatchConfig configures a SeccompWatch.
type SeccompWatchConfig struct {
	// Reader is the kernel log reader the sandbox tells about containers;
	// the watch starts it the first time an attempt runs under log mode.
	// Its OnEvent must call the watch's Handle.
	Reader interface {
		Start(context.Context) error
		Stop()
	}
	// Observer, when set, is told of each attributed record (metrics).
	Observer SeccompObserver
	// Flush is how often changed totals are sent (default
	// DefaultSeccompFlush).
	Flush  time.Duration
	Clock  clock.Clock
	Logger *slog.Logger
}

// SeccompWatch attributes seccomp log-mode records to the attempts this
// agent holds and sends each attempt's totals (syscall name and count) as
// records of its report: at most every Flush while they change, and once
// at its end (an empty one then says the attempt was observed and made no
// such syscall).
//
// It owns one loop, started with the reader the first time an attempt
// runs under seccomp log mode on runc (runsc has no log action), and only
// if the kernel log can be read (/dev/kmsg); a node without it logs why
// once and runs its tasks unwatched. Stop ends both and is safe twice or
// before anything started. Every method is safe concurrently.
type SeccompWatch struct {
	cfg SeccompWatchConfig

	// mu guards the fields below.
	mu       sync.Mutex
	started  bool
	startErr error
	stopped  bool
	attempts map[string]*seccompAttempt // run ID (task.attempt) -> attempt
	stop     chan struct{}
	done     chan struct{}
}

// seccompAttempt is one watched attempt's totals.
type seccompAttempt struct {
	pool   string
	taskID string
	q      *reportQueue
	counts map[string]uint64
	dirty  bool
}

// NewSeccompWatch returns a watch that has started nothing.
func NewSeccompWatch(cfg SeccompWatchConfig) *SeccompWatch {
	if cfg.Flush <= 0 {
		cfg.Flush = DefaultSeccompFlush
	}
	cfg.Clock = clock.OrReal(cfg.Clock)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &SeccompWatch{cfg: cfg, attempts: map[string]*seccompAttempt{}}
}

// watches reports whether an attempt of this security runs under seccomp
// log mode on a runtime that has it.
func seccompLogged(sec sandbox.Security, env []string) bool {
	eff, err := sandbox.Tighten(sec.WithDefaults(), env)
	return err == nil && eff.Seccomp == sandbox.SeccompLog && eff.Runtime == sandbox.RuntimeRunc
}

// watch starts attributing records of taskID's container to the attempt
// whose report queue is q, starting the reader if it is the first; false
// when the kernel log cannot be read here.
func (w *SeccompWatch) watch(task taskrun.Task, q *reportQueue) bool {
	if w == nil || !seccompLogged(task.Security, task.Env) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	if !w.started {
		w.started = true
		if err := w.cfg.Reader.Start(context.Background()); err != nil {
			w.startErr = err
			w.cfg.Logger.Warn("seccomp log mode: cannot read the kernel log, so would-be refused syscalls are not attributed to tasks on this machine",
				"pool", task.Pool, "err", err)
		} else {
			w.stop, w.done = make(chan struct{}), make(chan struct{})
			go w.loop(w.stop, w.done)
			w.cfg.Logger.Info("seccomp log mode: reading the kernel log for would-be refused syscalls", "pool", task.Pool)
		}
	}
	if w.startErr != nil {
		return false
	}
	w.attempts[task.RunID()] = &seccompAttempt{pool: task.Pool, taskID: task.ID, q: q, counts: map[string]uint64{}}
	return true
}

// Handle takes one record from the reader: it counts it for the watched
// attempt whose container made it (the record's TaskID is the sandbox's:
// the attempt's RunID) and tells the observer.
func (w *SeccompWatch) Handle(ev sandbox.SeccompEvent) {
	if ev.TaskID == "" {
		return
	}
	name := sandbox.SyscallName(ev.Arch, ev.Syscall)
	w.mu.Lock()
	a := w.attempts[ev.TaskID]
	if a != nil {
		a.counts[name]++
		a.dirty = true
	}
	w.mu.Unlock()
	if a != nil && w.cfg.Observer != nil {
		w.cfg.Observer.SeccompLogged(a.pool, a.taskID, name)
	}
}

// finish sends a watched attempt's last totals, after giving the reader a
// moment for records the kernel still prints, and forgets it. runID is
// the attempt's taskrun.Task.RunID.
func (w *SeccompWatch) finish(runID string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	_, ok := w.attempts[runID]
	w.mu.Unlock()
	if !ok {
		return
	}
	<-w.cfg.Clock.After(seccompSettle)
	w.mu.Lock()
	a := w.attempts[runID]
	delete(w.attempts, runID)
	w.mu.Unlock()
	if a != nil {
		a.q.pushSeccomp(w.record(a))
	}
}

// forget stops attributing records to an attempt without sending its
// totals (it detached: the agent stops).
func (w *SeccompWatch) forget(runID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.attempts, runID)
}

// record is an attempt's totals as a report record, most frequent first.
// The caller holds mu or owns a.
func (w *SeccompWatch) record(a *seccompAttempt) *agentv1.AttemptRecord {
	s := &v1.SeccompLogged{}
	for name, n := range a.counts {
		s.Syscalls = append(s.Syscalls, &v1.SeccompSyscall{Syscall: name, Count: n})
	}
	slices.SortFunc(s.Syscalls, func(x, y *v1.SeccompSyscall) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), strings.Compare(x.Syscall, y.Syscall))
	})
	a.dirty = false
	return &agentv1.AttemptRecord{Time: timestamppb.New(w.cfg.Clock.Now()), Record: &agentv1.AttemptRecord_Seccomp{Seccomp: s}}
}

// loop sends changed totals every Flush.
func (w *SeccompWatch) loop(stop, done chan struct{}) {
	defer close(done)
	t := w.cfg.Clock.NewTicker(w.cfg.Flush)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C():
		}
		type send struct {
			q *reportQueue
			r *agentv1.AttemptRecord
		}
		var out []send
		w.mu.Lock()
		for _, a := range w.attempts {
			if a.dirty {
				out = append(out, send{a.q, w.record(a)})
			}
		}
		w.mu.Unlock()
		for _, s := range out {
			s.q.pushSeccomp(s.r)
		}
	}
}

// Stop ends the flush loop and the reader. Safe twice and before start.
func (w *SeccompWatch) Stop() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.stopped = true
	stop, done, started := w.stop, w.done, w.started && w.startErr == nil
	w.stop = nil
	w.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	if started {
		w.cfg.Reader.Stop()
	}
}
