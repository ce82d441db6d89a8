package agent

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/levers9/levers9/agent/taskrun"
	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/internal/clock"
)

// ReportConfig bounds how an attempt's records travel to the controlplane.
// Zero fields take the defaults each names.
type ReportConfig struct {
	// MaxUnsentLogs is how many log records (default 10,000), and
	// MaxUnsentBytes how many bytes of their text (default 8 MiB), an
	// attempt keeps while the controlplane is slow or away; beyond them the
	// oldest unsent log records are dropped and counted. State updates are
	// never dropped.
	MaxUnsentLogs  int
	MaxUnsentBytes int
	// MaxBatchRecords and MaxBatchBytes bound one ReportAttempt call
	// (defaults 512 records, 256 KiB; a single larger record still goes).
	MaxBatchRecords int
	MaxBatchBytes   int
	// BackoffMin and BackoffMax bound the wait between failed calls
	// (defaults 100 ms and 2 s; doubled per failure, reset on success).
	BackoffMin time.Duration
	BackoffMax time.Duration
	// CallTimeout bounds one call (default 15 s).
	CallTimeout time.Duration
}

func (c ReportConfig) withDefaults() ReportConfig {
	if c.MaxUnsentLogs <= 0 {
		c.MaxUnsentLogs = 10000
	}
	if c.MaxUnsentBytes <= 0 {
		c.MaxUnsentBytes = 8 << 20
	}
	if c.MaxBatchRecords <= 0 {
		c.MaxBatchRecords = 512
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = 256 << 10
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 100 * time.Millisecond
	}
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = max(2*time.Second, c.BackoffMin)
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 15 * time.Second
	}
	return c
}

// gatherRunning is how long the RUNNING update waits for the attempt's
// first output before it goes alone.
const gatherRunning = 3 * time.Millisecond

// recordOverhead approximates a record's size beside its text.
const recordOverhead = 48

// resultHeadroom is what a ReportAttempt carrying a terminal update may
// need beside the update's result (the message, summary, digest, framing):
// far more than it ever takes. The result goes alone in its call (a record
// over MaxBatchBytes always does), so result plus headroom must fit in one
// tunnel message.
const resultHeadroom = 1 << 20

// maxResultBytes is the largest result an attempt sends: taskrun's 8 MiB,
// or less when a tunnel message of maxMessage bytes could not carry it with
// resultHeadroom beside. A larger result is reported as too large.
func maxResultBytes(maxMessage int) int {
	return max(1, min(taskrun.DefaultMaxResultBytes, maxMessage-resultHeadroom))
}

func recordSize(r *agentv1.AttemptRecord) int {
	if l := r.GetLog(); l != nil {
		return recordOverhead + len(l.Text)
	}
	if sc := r.GetSeccomp(); sc != nil {
		n := recordOverhead
		for _, c := range sc.Syscalls {
			n += 16 + len(c.Syscall)
		}
		return n
	}
	u := r.GetUpdate()
	return recordOverhead + len(u.GetMessage()) + len(u.GetResult().GetData()) + len(u.GetResult().GetError())
}

// reportQueue holds one attempt's records on their way to the controlplane.
// Records get their numbers (from 1, consecutive) only when they first go
// into a call, so dropping unsent log records never leaves a hole; a
// numbered record is kept, with its number, until acknowledged.
//
// The order is fixed by the attempt's life: the RUNNING update, the output
// lines (with the latest seccomp totals after the lines queued before
// them), the terminal update. Output read before the RUNNING update is
// known waits for it, so RUNNING is always record 1 of an attempt that
// started.
type reportQueue struct {
	cfg    ReportConfig
	notify chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	// sent are numbered acked+1.. and went out at least once.
	sent     []*agentv1.AttemptRecord
	running  *agentv1.AttemptRecord
	logs     []*agentv1.AttemptRecord // unsent, oldest first
	logBytes int
	terminal *agentv1.AttemptRecord
	// seccomp is the latest unsent seccomp totals record: each replaces
	// the one before (they are cumulative), and none is ever dropped.
	seccomp *agentv1.AttemptRecord
	// termSeq is the terminal record's number once it has one.
	termSeq uint64
	acked   uint64
	// dropped counts log records dropped here.
	dropped uint64
	// last is the latest log record time: stdout and stderr are read by
	// two goroutines, so a line can be queued after a later-read one;
	// record times never go back within an attempt.
	last time.Time
	// ends are the output file offsets just past each queued log
	// record's line; shipped is how far acknowledged records reach.
	ends    map[*agentv1.AttemptRecord]lineEnd
	shipped taskrun.Shipped
}

// lineEnd is where a log record's line ends in its stream's file.
type lineEnd struct {
	stream taskrun.Stream
	end    int64
}

func newReportQueue(cfg ReportConfig) *reportQueue {
	return &reportQueue{cfg: cfg.withDefaults(), notify: make(chan struct{}, 1), ends: map[*agentv1.AttemptRecord]lineEnd{}}
}

// resumedReportQueue is the queue of an attempt an earlier agent ran and
// reported up to s: records are numbered from s.Seq+1, and a RUNNING
// update the earlier agent delivered is not sent again.
func resumedReportQueue(cfg ReportConfig, s taskrun.Shipped) *reportQueue {
	q := newReportQueue(cfg)
	q.acked, q.shipped = s.Seq, s
	return q
}

func (q *reportQueue) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// pushRunning queues the RUNNING update ahead of any output.
func (q *reportQueue) pushRunning(r *agentv1.AttemptRecord) {
	q.mu.Lock()
	if q.acked > 0 || len(q.sent) > 0 {
		// Record 1, the RUNNING update, went out already (an earlier agent
		// sent it before it restarted).
		q.mu.Unlock()
		return
	}
	// Output read while the runtime was still returning is earlier than
	// the RUNNING event; the container was running then, and record times
	// should not go back.
	if len(q.logs) > 0 && q.logs[0].Time != nil && r.Time != nil && q.logs[0].Time.AsTime().Before(r.Time.AsTime()) {
		r.Time = q.logs[0].Time
	}
	// Lines queued after it, though read before it, are sent after it:
	// they must not be stamped earlier (it is sent ahead of the lines
	// already queued, so only the floor moves, never its own time).
	if r.Time != nil && r.Time.AsTime().After(q.last) {
		q.last = r.Time.AsTime()
	}
	q.running = r
	q.mu.Unlock()
	q.wake()
}

// runningAlone reports whether the RUNNING update waits to go out with
// nothing behind it, in the attempt's first call.
func (q *reportQueue) runningAlone() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running != nil && len(q.sent) == 0 && q.acked == 0 && len(q.logs) == 0 && q.terminal == nil
}

// pushLog queues an output line; when the unsent lines exceed the bounds
// the oldest go, their count carried on the next one kept.
func (q *reportQueue) pushLog(r *agentv1.AttemptRecord) { q.pushLogAt(r, lineEnd{}) }

// pushLogAt is pushLog for a line ending at e in its output file.
func (q *reportQueue) pushLogAt(r *agentv1.AttemptRecord, e lineEnd) {
	q.mu.Lock()
	if e.stream != "" {
		q.ends[r] = e
	}
	q.monotonic(r)
	q.logs = append(q.logs, r)
	q.logBytes += len(r.GetLog().GetText())
	for len(q.logs) > 1 && (len(q.logs) > q.cfg.MaxUnsentLogs || q.logBytes > q.cfg.MaxUnsentBytes) {
		old := q.logs[0].GetLog()
		delete(q.ends, q.logs[0])
		q.logs[0] = nil
		q.logs = q.logs[1:]
		q.logBytes -= len(old.GetText())
		q.dropped++
		next := q.logs[0].GetLog()
		next.DroppedBefore += 1 + old.GetDroppedBefore()
	}
	// Re-slicing from the front never frees the array; copy down once
	// half of it is dead.
	if cap(q.logs) > 64 && len(q.logs) < cap(q.logs)/4 {
		q.logs = append(make([]*agentv1.AttemptRecord, 0, 2*len(q.logs)), q.logs...)
	}
	started := q.running != nil || len(q.sent) > 0 || q.acked > 0
	q.mu.Unlock()
	if started {
		q.wake()
	}
}

// monotonic keeps r's time at or after the records queued before it.
func (q *reportQueue) monotonic(r *agentv1.AttemptRecord) {
	if r.Time == nil {
		return
	}
	if t := r.Time.AsTime(); t.Before(q.last) {
		r.Time = timestamppb.New(q.last)
	} else {
		q.last = t
	}
}

// pushSeccomp queues an attempt's seccomp totals, replacing unsent ones.
func (q *reportQueue) pushSeccomp(r *agentv1.AttemptRecord) {
	q.mu.Lock()
	q.monotonic(r)
	q.seccomp = r
	started := q.running != nil || len(q.sent) > 0 || q.acked > 0 || q.terminal != nil
	q.mu.Unlock()
	if started {
		q.wake()
	}
}

// pushTerminal queues the last record; its dropped_lines gets the lines
// dropped here added.
func (q *reportQueue) pushTerminal(r *agentv1.AttemptRecord) {
	q.mu.Lock()
	q.monotonic(r)
	r.GetUpdate().DroppedLines += q.dropped
	q.terminal = r
	q.mu.Unlock()
	q.wake()
}

// batch returns the next call's records: everything sent and not acked,
// then unsent records in order, within the call bounds. first is the
// number of records[0]; nil when there is nothing to send (or output
// waits for the RUNNING update).
func (q *reportQueue) batch() (first uint64, records []*agentv1.AttemptRecord) {
	q.mu.Lock()
	defer q.mu.Unlock()
	size := 0
	for _, r := range q.sent {
		size += recordSize(r)
	}
	next := q.acked + uint64(len(q.sent)) + 1
	room := func(r *agentv1.AttemptRecord) bool {
		return len(q.sent) == 0 || len(q.sent) < q.cfg.MaxBatchRecords && size+recordSize(r) <= q.cfg.MaxBatchBytes
	}
	take := func(r *agentv1.AttemptRecord) {
		q.sent = append(q.sent, r)
		size += recordSize(r)
		next++
	}
	if q.running != nil && room(q.running) {
		take(q.running)
		q.running = nil
	}
	// Output goes only after RUNNING (or, for an attempt that ended
	// before it started, before the terminal update).
	if q.running == nil && (next > 1 || q.terminal != nil) {
		for len(q.logs) > 0 && room(q.logs[0]) {
			r := q.logs[0]
			q.logs[0] = nil
			q.logs = q.logs[1:]
			q.logBytes -= len(r.GetLog().GetText())
			take(r)
		}
		if len(q.logs) == 0 {
			q.logs = nil
			if q.seccomp != nil && room(q.seccomp) {
				take(q.seccomp)
				q.seccomp = nil
			}
			if q.seccomp == nil && q.terminal != nil && room(q.terminal) {
				q.termSeq = next
				take(q.terminal)
				q.terminal = nil
			}
		}
	}
	if len(q.sent) == 0 {
		return 0, nil
	}
	return q.acked + 1, append([]*agentv1.AttemptRecord(nil), q.sent...)
}

// ack drops every sent record up to seq. It returns how far the
// acknowledged records reach and whether that moved.
func (q *reportQueue) ack(seq uint64) (taskrun.Shipped, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if seq <= q.acked {
		return q.shipped, false
	}
	n := min(seq-q.acked, uint64(len(q.sent)))
	for _, r := range q.sent[:n] {
		if e, ok := q.ends[r]; ok {
			delete(q.ends, r)
			if e.stream == taskrun.Stderr {
				q.shipped.Stderr = max(q.shipped.Stderr, e.end)
			} else {
				q.shipped.Stdout = max(q.shipped.Stdout, e.end)
			}
		}
	}
	clear(q.sent[:n])
	q.sent = q.sent[n:]
	q.acked += n
	q.shipped.Seq = q.acked
	return q.shipped, n > 0
}

// done reports whether the terminal record is acknowledged.
func (q *reportQueue) done() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.termSeq != 0 && q.acked >= q.termSeq
}

// reportFunc sends one ReportAttempt call.
type reportFunc func(ctx context.Context, req *agentv1.ReportAttemptRequest) (*agentv1.ReportAttemptResponse, error)

// reporter delivers one attempt's queue: at most one call in flight, the
// next one carrying everything that queued meanwhile; after an error the
// same numbered records go again after a capped backoff, for as long as it
// takes. It returns once the terminal record is acknowledged or ctx ends.
type reporter struct {
	taskID  string
	attempt int32
	q       *reportQueue
	send    reportFunc
	clock   clock.Clock
	log     *slog.Logger
	// onStop runs when the controlplane answers stop=true.
	onStop func()
	// onShipped, when set, records how far the acknowledged records reach
	// (for an agent that restarts while the attempt runs).
	onShipped func(taskrun.Shipped)
	// gather, when set, replaces gatherRunning (tests that must not depend
	// on a 3 ms timer on a loaded machine).
	gather time.Duration
}

// gatherRunning holds a RUNNING update that would go alone for up to
// gatherRunning, until something queues behind it. The first lines usually
// follow RUNNING within a millisecond or two: in RUNNING's call, the
// controlplane streams them without waiting for RUNNING's Postgres write.
// The timer is not the injected clock: this wait decides no outcome, and a
// fake clock must not hold RUNNING back. False when ctx ended.
func (r *reporter) gatherRunning(ctx context.Context) bool {
	if !r.q.runningAlone() {
		return true
	}
	wait := gatherRunning
	if r.gather > 0 {
		wait = r.gather
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	// A wake-up can be the RUNNING push's own: look again after each.
	for r.q.runningAlone() {
		select {
		case <-r.q.notify:
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	return true
}

func (r *reporter) run(ctx context.Context) {
	cfg := r.q.cfg
	backoff := cfg.BackoffMin
	failing := false
	for {
		if !r.gatherRunning(ctx) {
			return
		}
		first, recs := r.q.batch()
		if recs == nil {
			if r.q.done() {
				return
			}
			select {
			case <-r.q.notify:
				continue
			case <-ctx.Done():
				return
			}
		}
		cctx, cancel := context.WithTimeout(ctx, cfg.CallTimeout)
		resp, err := r.send(cctx, &agentv1.ReportAttemptRequest{TaskId: r.taskID, Attempt: r.attempt, FirstSeq: first, Records: recs})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				r.log.Warn("attempt report failed; retrying", "first_seq", first, "records", len(recs), "err", err)
				failing = true
			}
			select {
			case <-r.clock.After(backoff):
			case <-ctx.Done():
				return
			}
			backoff = min(2*backoff, cfg.BackoffMax)
			continue
		}
		if failing {
			r.log.Info("attempt report delivered again", "first_seq", first)
			failing = false
		}
		if s, moved := r.q.ack(resp.AckedSeq); moved && r.onShipped != nil {
			r.onShipped(s)
		}
		if resp.Stop && r.onStop != nil {
			r.onStop()
		}
		if resp.AckedSeq < first {
			// Stored nothing: going again at once would spin.
			select {
			case <-r.clock.After(backoff):
			case <-ctx.Done():
				return
			}
			backoff = min(2*backoff, cfg.BackoffMax)
			continue
		}
		backoff = cfg.BackoffMin
	}
}
