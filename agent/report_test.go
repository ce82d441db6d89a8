package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/levers9/levers9/agent/taskrun"
	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/tunnel"
)

func testLog(text string) *agentv1.AttemptRecord {
	return &agentv1.AttemptRecord{Record: &agentv1.AttemptRecord_Log{Log: &v1.LogLine{Stream: v1.LogStream_LOG_STREAM_STDOUT, Text: text}}}
}

func testUpdate(s v1.AttemptState) *agentv1.AttemptRecord {
	return &agentv1.AttemptRecord{Record: &agentv1.AttemptRecord_Update{Update: &agentv1.AttemptUpdate{State: s}}}
}

// describe renders records as "RUN", "FAIL", "a+2" (text and dropped_before).
func describe(recs []*agentv1.AttemptRecord) []string {
	var out []string
	for _, r := range recs {
		if l := r.GetLog(); l != nil {
			s := l.Text
			if l.DroppedBefore > 0 {
				s += "+" + strconv.FormatUint(l.DroppedBefore, 10)
			}
			out = append(out, s)
			continue
		}
		switch r.GetUpdate().State {
		case v1.AttemptState_ATTEMPT_STATE_RUNNING:
			out = append(out, "RUN")
		default:
			out = append(out, "END")
		}
	}
	return out
}

// TestReportQueue drives the queue by hand: what each call carries, its
// first number, and what an ack leaves.
func TestReportQueue(t *testing.T) {
	type step struct {
		push  []string // "RUN", "END" or log text
		ack   uint64   // acks before the batch when > 0
		first uint64
		want  []string
	}
	for _, tc := range []struct {
		name  string
		cfg   ReportConfig
		steps []step
		// wantDropped is the terminal's dropped_lines.
		wantDropped uint64
	}{
		{name: "output waits for RUNNING", steps: []step{
			{push: []string{"a", "b"}, want: nil},
			{push: []string{"RUN"}, first: 1, want: []string{"RUN", "a", "b"}},
			{push: []string{"c"}, first: 1, want: []string{"RUN", "a", "b", "c"}},
			{ack: 2, push: []string{"END"}, first: 3, want: []string{"b", "c", "END"}},
			{ack: 5, want: nil},
		}},
		{name: "failed before start", steps: []step{
			{push: []string{"END"}, first: 1, want: []string{"END"}},
		}},
		{name: "batch bounds", cfg: ReportConfig{MaxBatchRecords: 2}, steps: []step{
			{push: []string{"RUN", "a", "b", "END"}, first: 1, want: []string{"RUN", "a"}},
			{ack: 2, first: 3, want: []string{"b", "END"}},
		}},
		{name: "overflow drops the oldest unsent lines", cfg: ReportConfig{MaxUnsentLogs: 2}, steps: []step{
			{push: []string{"RUN"}, first: 1, want: []string{"RUN"}},
			{push: []string{"a", "b", "c", "d", "e"}, first: 1, want: []string{"RUN", "d+3", "e"}},
			{ack: 3, push: []string{"f", "g", "h", "END"}, first: 4, want: []string{"g+1", "h", "END"}},
		}, wantDropped: 4},
		{name: "bytes bound", cfg: ReportConfig{MaxUnsentBytes: 5}, steps: []step{
			{push: []string{"RUN", "aaa", "bbb", "cc"}, first: 1, want: []string{"RUN", "bbb+1", "cc"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newReportQueue(tc.cfg)
			var term *agentv1.AttemptRecord
			for i, s := range tc.steps {
				if s.ack > 0 {
					q.ack(s.ack)
				}
				for _, p := range s.push {
					switch p {
					case "RUN":
						q.pushRunning(testUpdate(v1.AttemptState_ATTEMPT_STATE_RUNNING))
					case "END":
						term = testUpdate(v1.AttemptState_ATTEMPT_STATE_SUCCEEDED)
						q.pushTerminal(term)
					default:
						q.pushLog(testLog(p))
					}
				}
				first, recs := q.batch()
				if got := describe(recs); first != s.first || !slices.Equal(got, s.want) {
					t.Fatalf("step %d: batch %d %q, want %d %q", i, first, got, s.first, s.want)
				}
			}
			if term != nil && term.GetUpdate().DroppedLines != tc.wantDropped {
				t.Errorf("terminal dropped_lines %d, want %d", term.GetUpdate().DroppedLines, tc.wantDropped)
			}
		})
	}
}

// instantClock fires every After at once and records the waits; the rest
// is the wall clock.
type instantClock struct {
	clock.Clock
	// mu guards waits.
	mu    sync.Mutex
	waits []time.Duration
}

func (c *instantClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
	ch := make(chan time.Time, 1)
	ch <- time.Now()
	return ch
}

// store is a controlplane's view of one attempt: records by number,
// acked as stored, with failures on request.
type store struct {
	// mu guards the fields below.
	mu    sync.Mutex
	recs  []*agentv1.AttemptRecord
	calls int
	// failBefore fails a call before storing, failAfter after (the
	// response is lost).
	failBefore, failAfter func(call int) error
	stopAt                int // answer stop=true from this call on (0: never)
	firstSeq              []uint64
}

func (s *store) report(_ context.Context, req *agentv1.ReportAttemptRequest) (*agentv1.ReportAttemptResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	s.firstSeq = append(s.firstSeq, req.FirstSeq)
	if s.failBefore != nil {
		if err := s.failBefore(s.calls); err != nil {
			return nil, err
		}
	}
	for i, r := range req.Records {
		seq := req.FirstSeq + uint64(i)
		if seq == uint64(len(s.recs))+1 {
			s.recs = append(s.recs, r)
		}
	}
	if s.failAfter != nil {
		if err := s.failAfter(s.calls); err != nil {
			return nil, err
		}
	}
	return &agentv1.ReportAttemptResponse{AckedSeq: uint64(len(s.recs)), Stop: s.stopAt > 0 && s.calls >= s.stopAt}, nil
}

// TestReporterRetries: calls that fail (before or after the controlplane
// stored them) are resent with the same numbers after a capped backoff,
// and the controlplane ends with every record once, in order.
func TestReporterRetries(t *testing.T) {
	errDown := errors.New("controlplane restarting")
	between := func(lo, hi int) func(int) error {
		return func(call int) error {
			if call >= lo && call <= hi {
				return errDown
			}
			return nil
		}
	}
	st := &store{failBefore: between(2, 4), failAfter: between(5, 8)}
	clk := &instantClock{Clock: clock.Real()}
	q := newReportQueue(ReportConfig{MaxBatchRecords: 3})
	stopped := make(chan struct{})
	r := &reporter{taskID: "t", attempt: 1, q: q, send: st.report, clock: clk, log: slog.New(slog.DiscardHandler)}
	var once sync.Once
	r.onStop = func() { once.Do(func() { close(stopped) }) }
	st.stopAt = 10
	q.pushRunning(testUpdate(v1.AttemptState_ATTEMPT_STATE_RUNNING))
	var want []string
	want = append(want, "RUN")
	for i := 0; i < 20; i++ {
		q.pushLog(testLog(fmt.Sprint(i)))
		want = append(want, fmt.Sprint(i))
	}
	q.pushTerminal(testUpdate(v1.AttemptState_ATTEMPT_STATE_SUCCEEDED))
	want = append(want, "END")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.run(ctx)
	if !q.done() {
		t.Fatal("reporter returned before the terminal record was acked")
	}
	if got := describe(st.recs); !slices.Equal(got, want) {
		t.Errorf("stored %q, want %q", got, want)
	}
	select {
	case <-stopped:
	default:
		t.Error("stop=true did not reach onStop")
	}
	wantWaits := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 2 * time.Second, 2 * time.Second}
	if !slices.Equal(clk.waits, wantWaits) {
		t.Errorf("backoff waits %v, want %v", clk.waits, wantWaits)
	}
	// Call 1 stored 1-3; calls 2-8 failed (5-8 after storing 4-6) and
	// each resent from 4.
	for i, f := range st.firstSeq[1:8] {
		if f != 4 {
			t.Errorf("call %d first_seq %d, want 4 (resend of the unacked batch)", i+2, f)
		}
	}
}

// TestRunningGathersFirstLines: RUNNING waits a moment for the first
// output and takes it in the same call; with no output it goes alone,
// only that moment late.
func TestRunningGathersFirstLines(t *testing.T) {
	for _, tc := range []struct {
		name   string
		gather time.Duration
		lines  []string
		want   []string
	}{
		// The window is long so that a loaded machine cannot let it pass
		// before the line is pushed; the line ends the wait at once.
		{"a line soon after", time.Minute, []string{"hi"}, []string{"RUN", "hi"}},
		{"no output", gatherRunning, nil, []string{"RUN"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &store{}
			q := newReportQueue(ReportConfig{})
			r := &reporter{taskID: "t", attempt: 1, q: q, send: st.report, clock: clock.Real(), log: slog.New(slog.DiscardHandler), gather: tc.gather}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() { defer close(done); r.run(ctx) }()
			q.pushRunning(testUpdate(v1.AttemptState_ATTEMPT_STATE_RUNNING))
			time.Sleep(gatherRunning / 3)
			for _, l := range tc.lines {
				q.pushLog(testLog(l))
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				st.mu.Lock()
				calls, got := st.calls, describe(st.recs)
				st.mu.Unlock()
				if len(got) == len(tc.want) {
					if calls != 1 || !slices.Equal(got, tc.want) {
						t.Errorf("%d calls stored %q, want one call with %q", calls, got, tc.want)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("stored %q, want %q", got, tc.want)
				}
				time.Sleep(time.Millisecond)
			}
			cancel()
			<-done
		})
	}
}

// TestTasksStartStop: stop before start and twice is safe, a stopped
// agent refuses attempts (Unavailable) and never starts again, and stop
// returns with attempts that never got to run.
func TestTasksStartStop(t *testing.T) {
	valid := &agentv1.TaskAttempt{TaskId: "t", Attempt: 1, Image: "busybox"}
	for i := 0; i < 50; i++ {
		r, err := taskrun.New(taskrun.Config{Sandbox: &sandbox.Sandbox{}, Images: &image.Store{}})
		if err != nil {
			t.Fatal(err)
		}
		ts := newTasks(r, (&store{}).report, ReportConfig{}, clock.NewFake(time.Now()), slog.New(slog.DiscardHandler), "default")
		if _, err := ts.run(context.Background(), valid); !errdefs.IsUnavailable(err) {
			t.Fatalf("run before start: %v", err)
		}
		if i%2 == 0 {
			ts.stop()
		}
		ts.start(context.Background())
		_, err = ts.run(context.Background(), valid)
		if (i%2 == 0) != errdefs.IsUnavailable(err) {
			t.Fatalf("run after start (stopped before: %v): %v", i%2 == 0, err)
		}
		ts.stop()
		ts.stop()
		if _, err := ts.run(context.Background(), valid); !errdefs.IsUnavailable(err) {
			t.Fatalf("run after stop: %v", err)
		}
		if got := ts.list(); len(got) != 0 {
			t.Fatalf("held after stop: %v", got)
		}
	}
}

// Record times never go back in the order records are sent, whichever of
// RUNNING and the first lines was queued first.
func TestReportQueueTimesNeverGoBack(t *testing.T) {
	at := func(r *agentv1.AttemptRecord, sec int64) *agentv1.AttemptRecord {
		r.Time = timestamppb.New(time.Unix(sec, 0))
		return r
	}
	tests := []struct {
		name string
		push func(q *reportQueue)
	}{
		{"line read before RUNNING, queued after it", func(q *reportQueue) {
			q.pushRunning(at(testUpdate(v1.AttemptState_ATTEMPT_STATE_RUNNING), 10))
			q.pushLog(at(testLog("a"), 5))
			q.pushLog(at(testLog("b"), 12))
		}},
		{"lines queued before RUNNING", func(q *reportQueue) {
			q.pushLog(at(testLog("a"), 3))
			q.pushLog(at(testLog("b"), 4))
			q.pushRunning(at(testUpdate(v1.AttemptState_ATTEMPT_STATE_RUNNING), 10))
			q.pushLog(at(testLog("c"), 2))
			q.pushTerminal(at(testUpdate(v1.AttemptState_ATTEMPT_STATE_SUCCEEDED), 1))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newReportQueue(ReportConfig{})
			tt.push(q)
			_, recs := q.batch()
			var last time.Time
			for i, r := range recs {
				if r.Time.AsTime().Before(last) {
					t.Fatalf("record %d at %v after one at %v", i, r.Time.AsTime(), last)
				}
				last = r.Time.AsTime()
			}
			if len(recs) < 3 {
				t.Fatalf("%d records", len(recs))
			}
		})
	}
}

// TestResultFitsOneReport: the result limit leaves room in a tunnel
// message, and a terminal update carrying the largest result goes in a
// call of its own, under the tunnel's message limit, after the output
// before it.
func TestResultFitsOneReport(t *testing.T) {
	maxMessage := tunnel.Limits{}.WithDefaults().MaxMessageSize
	limit := maxResultBytes(maxMessage)
	if limit != taskrun.DefaultMaxResultBytes {
		t.Fatalf("result limit with the default tunnel = %d, want %d", limit, taskrun.DefaultMaxResultBytes)
	}
	if got := maxResultBytes(4 << 20); got != 3<<20 {
		t.Errorf("result limit under a 4 MiB message = %d, want 3 MiB", got)
	}
	q := newReportQueue(ReportConfig{})
	q.pushRunning(testUpdate(v1.AttemptState_ATTEMPT_STATE_RUNNING))
	for range 300 {
		q.pushLog(testLog(strings.Repeat("x", 1000)))
	}
	term := testUpdate(v1.AttemptState_ATTEMPT_STATE_SUCCEEDED)
	term.GetUpdate().Result = &agentv1.AttemptResult{Present: true, Data: bytes.Repeat([]byte{0xff}, limit)}
	q.pushTerminal(term)
	sawResult := false
	for calls := 0; !q.done(); calls++ {
		if calls > 10 {
			t.Fatal("the terminal update was never sent")
		}
		first, recs := q.batch()
		req := &agentv1.ReportAttemptRequest{TaskId: "t_0123456789abcdefghij", Attempt: 9999, FirstSeq: first, Records: recs}
		if n := proto.Size(req); n > maxMessage {
			t.Fatalf("a report of %d bytes, over the tunnel's %d", n, maxMessage)
		}
		for _, r := range recs {
			if r.GetUpdate().GetResult() != nil {
				sawResult = true
				if len(recs) != 1 {
					t.Errorf("the result shares its call with %d other records", len(recs)-1)
				}
			}
		}
		q.ack(first + uint64(len(recs)) - 1)
	}
	if !sawResult {
		t.Fatal("no call carried the result")
	}
}
