package taskrun

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
)

func TestRunOutputAndExitCode(t *testing.T) {
	b := setup(t, setupOpts{})
	for _, tc := range []struct {
		name       string
		script     string
		wantState  State
		wantCode   int
		wantStdout []string
		wantStderr []string
	}{
		{"fails", "echo hi; echo err >&2; echo bye; exit 3", StateFailed, 3, []string{"hi", "bye"}, []string{"err"}},
		{"succeeds", "echo ok; printf 'no newline'", StateSucceeded, 0, []string{"ok", "no newline"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := b.task("out-"+tc.name, tc.script)
			var rec recorder
			res, err := b.runner.Run(testCtx(t), tk, rec.output())
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.State != tc.wantState || res.Exit.Code != tc.wantCode {
				t.Errorf("result %s exit %d, want %s exit %d", res.State, res.Exit.Code, tc.wantState, tc.wantCode)
			}
			want := []State{StatePending, StatePulling, StateStarting, StateRunning, tc.wantState}
			if got := rec.states(); !slices.Equal(got, want) {
				t.Errorf("states %v, want %v", got, want)
			}
			if got := rec.texts(Stdout); !slices.Equal(got, tc.wantStdout) {
				t.Errorf("stdout %q, want %q", got, tc.wantStdout)
			}
			if got := rec.texts(Stderr); !slices.Equal(got, tc.wantStderr) {
				t.Errorf("stderr %q, want %q", got, tc.wantStderr)
			}
			var last time.Time
			for _, l := range rec.lines {
				if l.Time.IsZero() || l.Time.Before(last) {
					t.Errorf("line %q has time %v after %v", l.Text, l.Time, last)
				}
				last = l.Time
			}
			checkPhases(t, rec.running().Phases)
			sec, ok := rec.event(EventSecurity)
			if !ok || sec.Effective == nil || sec.Effective.Runtime != sandbox.RuntimeRunc || sec.Effective.Profile != sandbox.ProfileHardened {
				t.Errorf("security event %+v, want runc hardened", sec)
			}
			if res.ImageDigest != b.image.Digest || res.DroppedLines != 0 {
				t.Errorf("result digest %s dropped %d, want %s and 0", res.ImageDigest, res.DroppedLines, b.image.Digest)
			}
			b.assertClean(t, tk)
		})
	}
}

// TestCancelAndTimeout kills running tasks: a cancel reaches a task that
// handles SIGTERM and exits within the grace period; a timeout needs
// SIGKILL for a pid 1 that ignores SIGTERM.
func TestCancelAndTimeout(t *testing.T) {
	b := setup(t, setupOpts{})
	for _, tc := range []struct {
		name      string
		script    string
		timeout   time.Duration
		cancel    bool
		wantState State
		wantSig   syscall.Signal
		wantOut   []string
	}{
		{"cancel", "trap 'echo term; exit 0' TERM; echo up; sleep 60 & wait", 0, true, StateCancelled, 0, []string{"up", "term"}},
		{"timeout", "echo up; exec sleep 60", time.Second, false, StateTimedOut, syscall.SIGKILL, []string{"up"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := b.task("kill-"+tc.name, tc.script)
			tk.Timeout = tc.timeout
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			var rec recorder
			if tc.cancel {
				go func() {
					// Cancel once RUNNING: the trap must see SIGTERM, and output
					// can arrive while the attempt is still STARTING.
					testenv.Eventually(t, 20*time.Second, "the task's first line and RUNNING", func() bool {
						a := b.runner.Attempts()
						return len(rec.texts(Stdout)) > 0 && len(a) == 1 && a[0].State == StateRunning
					})
					cancel()
				}()
			}
			start := time.Now()
			res, err := b.runner.Run(ctx, tk, rec.output())
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.State != tc.wantState || res.Exit.Signal != tc.wantSig {
				t.Errorf("result %s signal %v (exit %d), want %s signal %v", res.State, res.Exit.Signal, res.Exit.Code, tc.wantState, tc.wantSig)
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("kill took %v", d)
			}
			if got := rec.texts(Stdout); !slices.Equal(got, tc.wantOut) {
				t.Errorf("stdout %q, want %q", got, tc.wantOut)
			}
			b.assertClean(t, tk)
		})
	}
}

// TestSlowSinkNeverBlocksTheContainer holds the sink until the container
// has exited: 200k lines fit through a 1024-line buffer only by dropping,
// and every line is either delivered or counted.
func TestSlowSinkNeverBlocksTheContainer(t *testing.T) {
	const n = 200000
	b := setup(t, setupOpts{cfg: func(c *Config) { c.LogBuffer = 1024 }})
	tk := b.task("slow-sink", "seq 1 "+strconv.Itoa(n))
	exited := make(chan struct{})
	var got []LogLine
	var dropped Event
	out := Output{
		Logs: LogSinkFunc(func(ctx context.Context, l LogLine) error {
			select {
			case <-exited:
			case <-ctx.Done():
				return ctx.Err()
			}
			got = append(got, l)
			return nil
		}),
		Events: func(e Event) {
			switch e.Kind {
			case EventExited:
				close(exited)
			case EventDroppedLines:
				dropped = e
			}
		},
	}
	res, err := b.runner.Run(testCtx(t), tk, out)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.State != StateSucceeded {
		t.Fatalf("state %s, want SUCCEEDED", res.State)
	}
	var gaps uint64
	for _, l := range got {
		gaps += l.DroppedBefore
	}
	if res.DroppedLines == 0 || uint64(len(got))+res.DroppedLines != n || gaps != res.DroppedLines {
		t.Errorf("delivered %d + dropped %d (gaps %d), want > 0 dropped adding up to %d", len(got), res.DroppedLines, gaps, n)
	}
	if dropped.DroppedLines != res.DroppedLines {
		t.Errorf("dropped-lines event says %d, result %d", dropped.DroppedLines, res.DroppedLines)
	}
	if len(got) == 0 || got[len(got)-1].Text != strconv.Itoa(n) {
		t.Errorf("last delivered line is not %d (the tail is kept)", n)
	}
	b.assertClean(t, tk)
}

// TestCachedImageWithoutRegistry runs an image a second time after the
// registry is gone.
func TestCachedImageWithoutRegistry(t *testing.T) {
	b := setup(t, setupOpts{})
	for i, step := range []string{"pull", "cached"} {
		if step == "cached" {
			b.reg.Stop()
			if err := b.reg.WaitGone(testCtx(t)); err != nil {
				t.Fatal(err)
			}
		}
		tk := b.task("cache-"+step, "echo "+step)
		tk.Attempt = i + 1
		var rec recorder
		res, err := b.runner.Run(testCtx(t), tk, rec.output())
		if err != nil || res.State != StateSucceeded || !slices.Equal(rec.texts(Stdout), []string{step}) {
			t.Fatalf("%s run: %v, %s, output %q", step, err, res.State, rec.texts(Stdout))
		}
	}
}

// TestFailuresBeforeStart: a task that cannot start is FAILED with an
// error naming the problem, and leaves nothing behind.
func TestFailuresBeforeStart(t *testing.T) {
	b := setup(t, setupOpts{})
	for _, tc := range []struct {
		name   string
		mutate func(*Task)
		want   string
		states []State
	}{
		{"unknown image", func(tk *Task) { tk.Image = b.reg.Host + "/l9r/none:nope" }, "pull image",
			[]State{StatePending, StatePulling, StateFailed}},
		{"unknown user", func(tk *Task) { tk.User = "nosuchuser" }, `user "nosuchuser"`,
			[]State{StatePending, StatePulling, StateFailed}},
		{"looser security", func(tk *Task) { tk.Env = []string{"LEVERS9_SECURITY_PROFILE=legacy"} }, "LEVERS9_SECURITY_PROFILE",
			[]State{StatePending, StatePulling, StateStarting, StateFailed}},
		{"gpu on a node without", func(tk *Task) { tk.GPUs = 1; tk.GPUDevices = []string{"0"} }, "gpu",
			[]State{StatePending, StatePulling, StateStarting, StateFailed}},
		{"invalid task", func(tk *Task) { tk.Attempt = 0; tk.Cwd = "rel" }, "task.attempt",
			[]State{StatePending, StateFailed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := b.task("bad", "true")
			tc.mutate(&tk)
			var rec recorder
			res, err := b.runner.Run(testCtx(t), tk, rec.output())
			if err == nil || res.State != StateFailed || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %s, %v; want FAILED with %q", res.State, err, tc.want)
			}
			if got := rec.states(); !slices.Equal(got, tc.states) {
				t.Errorf("states %v, want %v", got, tc.states)
			}
			if tk.Attempt > 0 {
				b.assertClean(t, tk)
			}
		})
	}
}

// TestShutdownDetaches stops the Runner while a task runs: Run returns
// ErrDetached and the container keeps running until Reconcile removes it.
func TestShutdownDetaches(t *testing.T) {
	b := setup(t, setupOpts{})
	tk := b.task("detach", "echo up; exec sleep 60")
	var rec recorder
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(testCtx(t), tk, rec.output())
		done <- err
	}()
	// Output can arrive before Start returns and the attempt is RUNNING;
	// wait for both, since Stop while STARTING cleans up instead.
	testenv.Eventually(t, 20*time.Second, "the task's first line and RUNNING", func() bool {
		a := b.runner.Attempts()
		return len(rec.texts(Stdout)) > 0 && len(a) == 1 && a[0].State == StateRunning
	})
	cid := b.sb.ContainerID(tk.runID())
	want := []AttemptInfo{{TaskID: "detach", Attempt: 1, State: StateRunning, ContainerID: cid}}
	if got := b.runner.Attempts(); !slices.Equal(got, want) {
		t.Errorf("Attempts() = %+v, want %+v", got, want)
	}
	if _, err := b.runner.Run(testCtx(t), tk, Output{}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second Run of a running attempt: %v, want already exists", err)
	}
	b.runner.Stop()
	if err := <-done; !errors.Is(err, ErrDetached) {
		t.Fatalf("Run after Stop: %v, want ErrDetached", err)
	}
	st, err := b.sb.Runtime(sandbox.RuntimeRunc)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := st.State(testCtx(t), cid); err != nil || s.Status != sandbox.StatusRunning {
		t.Fatalf("detached container state %+v, %v; want running", s, err)
	}
	if got := rec.states(); got[len(got)-1] != StateRunning {
		t.Errorf("states %v end in a terminal state", got)
	}
	if _, err := b.runner.Run(testCtx(t), b.task("late", "true"), Output{}); err == nil {
		t.Error("Run after Stop succeeded")
	}
	if _, err := os.Stat(filepath.Join(b.root, "attempts", tk.runID()+".json")); err != nil {
		t.Errorf("record of the detached attempt: %v", err)
	}
	lost, err := b.runner.Reconcile(testCtx(t))
	if err != nil || len(lost) != 1 || lost[0].TaskID != "detach" || lost[0].Attempt != 1 || lost[0].ContainerID != cid || lost[0].Pool != "default" {
		t.Fatalf("Reconcile = %+v, %v; want the detached attempt", lost, err)
	}
	b.assertClean(t, tk)
}

func TestRunsc(t *testing.T) {
	testenv.RequireBinary(t, "runsc")
	b := setup(t, setupOpts{})
	tk := b.task("runsc", "echo hi from gvisor")
	tk.Security.Runtime = sandbox.RuntimeRunsc
	var rec recorder
	res, err := b.runner.Run(testCtx(t), tk, rec.output())
	if err != nil || res.State != StateSucceeded {
		t.Fatalf("Run = %s, %v", res.State, err)
	}
	if res.Effective == nil || res.Effective.Runtime != sandbox.RuntimeRunsc || res.Effective.MaskedPaths {
		t.Errorf("effective %+v, want runsc without masked paths", res.Effective)
	}
	if got := rec.texts(Stdout); !slices.Equal(got, []string{"hi from gvisor"}) {
		t.Errorf("stdout %q", got)
	}
	b.assertClean(t, tk)
	if _, err := os.Stat(filepath.Join(testStateDir, b.sb.ContainerID(tk.runID()))); !os.IsNotExist(err) {
		t.Errorf("runsc state left: %v", err)
	}
}

// TestConcurrentAttempts runs several attempts at once through one Runner
// and checks each gets its own output and exit code.
func TestConcurrentAttempts(t *testing.T) {
	b := setup(t, setupOpts{})
	const n = 4
	type out struct {
		res  Result
		err  error
		rec  *recorder
		task Task
	}
	results := make(chan out, n)
	for i := 0; i < n; i++ {
		tk := b.task("conc-"+strconv.Itoa(i), "echo task "+strconv.Itoa(i)+"; exit "+strconv.Itoa(i))
		go func() {
			rec := &recorder{}
			res, err := b.runner.Run(testCtx(t), tk, rec.output())
			results <- out{res, err, rec, tk}
		}()
	}
	for i := 0; i < n; i++ {
		o := <-results
		want, _ := strconv.Atoi(o.task.ID[len("conc-"):])
		if o.err != nil || o.res.Exit.Code != want || !slices.Equal(o.rec.texts(Stdout), []string{"task " + strconv.Itoa(want)}) {
			t.Errorf("%s: %v exit %d output %q", o.task.ID, o.err, o.res.Exit.Code, o.rec.texts(Stdout))
		}
		b.assertClean(t, o.task)
	}
}

// TestStartStop: Stop before Start and twice is safe, Run outside
// Start..Stop is refused, and a stopped Runner does not start again.
func TestStartStop(t *testing.T) {
	for i := 0; i < 50; i++ {
		r, err := New(Config{Sandbox: &sandbox.Sandbox{}, Images: &image.Store{}})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			r.Stop()
		}
		if _, err := r.Run(context.Background(), Task{ID: "t", Attempt: 1, Image: "x"}, Output{}); !errdefs.IsUnavailable(err) {
			t.Fatalf("Run before Start: %v", err)
		}
		err = r.Start(context.Background())
		if (i%2 == 0) != (err != nil) {
			t.Fatalf("Start after Stop=%v: %v", i%2 == 0, err)
		}
		r.Stop()
		r.Stop()
		if _, err := r.Run(context.Background(), Task{ID: "t", Attempt: 1, Image: "x"}, Output{}); !errdefs.IsUnavailable(err) {
			t.Fatalf("Run after Stop: %v", err)
		}
	}
	if _, err := New(Config{KillGrace: -1, StateDir: "rel"}); err == nil || !contains(err.Error(), "taskrun.sandbox") ||
		!contains(err.Error(), "taskrun.killGrace") || !contains(err.Error(), "taskrun.stateDir") {
		t.Errorf("bad config: %v", err)
	}
}

// TestCancelledBeforeStart: a kill context that ended before the container
// started makes the attempt CANCELLED without an error.
func TestCancelledBeforeStart(t *testing.T) {
	b := setup(t, setupOpts{})
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	tk := b.task("early", "true")
	var rec recorder
	res, err := b.runner.Run(ctx, tk, rec.output())
	if err != nil || res.State != StateCancelled {
		t.Fatalf("Run = %s, %v; want CANCELLED", res.State, err)
	}
	if got, want := rec.states(), []State{StatePending, StatePulling, StateCancelled}; !slices.Equal(got, want) {
		t.Errorf("states %v, want %v", got, want)
	}
	b.assertClean(t, tk)
}

// TestSecurityReported: a task tightening a legacy pool through its env is
// reported with what the runtime applied.
func TestSecurityReported(t *testing.T) {
	b := setup(t, setupOpts{})
	for _, tc := range []struct {
		name        string
		env         []string
		wantProfile sandbox.Profile
		wantSeccomp sandbox.SeccompMode
	}{
		{"pool", nil, sandbox.ProfileLegacy, sandbox.SeccompOff},
		{"tightened", []string{sandbox.EnvSecurityProfile + "=hardened", sandbox.EnvSeccomp + "=enforce"}, sandbox.ProfileHardened, sandbox.SeccompEnforce},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := b.task("sec-"+tc.name, "true")
			tk.Security = sandbox.Security{Profile: sandbox.ProfileLegacy, Seccomp: sandbox.SeccompOff, Runtime: sandbox.RuntimeRunc}
			tk.Env = tc.env
			var rec recorder
			res, err := b.runner.Run(testCtx(t), tk, rec.output())
			if err != nil || res.State != StateSucceeded {
				t.Fatalf("Run = %s, %v", res.State, err)
			}
			ev, ok := rec.event(EventSecurity)
			if !ok || ev.Effective.Profile != tc.wantProfile || ev.Effective.Seccomp != tc.wantSeccomp || res.Effective.Profile != tc.wantProfile {
				t.Errorf("effective %+v (event %v), want %s/%s", res.Effective, ok, tc.wantProfile, tc.wantSeccomp)
			}
		})
	}
}

// checkPhases wants a start split into the image hook first and the
// sandbox's prepare, create and start last, each a real duration: even
// OCI's create, which only records the container, writes files.
func checkPhases(t *testing.T, phases []Phase) {
	t.Helper()
	var names []string
	for _, p := range phases {
		names = append(names, p.Name)
		if p.Took < 0 {
			t.Errorf("phase %s took %v", p.Name, p.Took)
		}
	}
	if len(names) < 4 || names[0] != "image" || !slices.Equal(names[len(names)-3:], []string{"prepare", "create", "start"}) {
		t.Fatalf("phases %v, want image first and prepare, create, start last", names)
	}
	if create := phases[len(phases)-2]; create.Took <= 0 {
		t.Errorf("create took %v, want more than nothing", create.Took)
	}
}
