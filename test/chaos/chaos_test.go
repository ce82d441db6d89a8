package chaos

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"math/big"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
)

// form is the size of a run: the short one in `make test`, the long one
// for LEVERS9_CHAOS_DURATION.
type form struct {
	tasks              int
	duration           time.Duration // how long faults go on (long form)
	submitEvery        time.Duration
	extraFaults        int // short form: faults beyond one of each kind
	gapMin, gapMax     time.Duration
	redisDown, dropFor time.Duration
	drain              time.Duration // how long tasks may take after the last fault
}

// runForm is the short form, or the long one for LEVERS9_CHAOS_DURATION
// (LEVERS9_CHAOS_TASKS changes its 1,000 tasks).
func runForm(t *testing.T) form {
	t.Helper()
	if v := os.Getenv("LEVERS9_CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute {
			t.Fatalf("LEVERS9_CHAOS_DURATION=%q: want a duration of at least 1m", v)
		}
		n := 1000
		if v := os.Getenv("LEVERS9_CHAOS_TASKS"); v != "" {
			if n, err = strconv.Atoi(v); err != nil || n < 1 {
				t.Fatalf("LEVERS9_CHAOS_TASKS=%q: want a positive count", v)
			}
		}
		// Tasks are submitted over the first 80% of the run.
		return form{tasks: n, duration: d, submitEvery: d * 8 / 10 / time.Duration(n), gapMin: 5 * time.Second, gapMax: 30 * time.Second,
			redisDown: 10 * time.Second, dropFor: time.Minute, drain: 5 * time.Minute}
	}
	return form{tasks: 72, submitEvery: 500 * time.Millisecond, extraFaults: 3, gapMin: 2 * time.Second, gapMax: 4 * time.Second,
		redisDown: 5 * time.Second, dropFor: 10 * time.Second, drain: 90 * time.Second}
}

// TestChaos is the whole-stack fault run (issue 23, item 6): see the
// package doc. LEVERS9_CHAOS_SEED repeats a run's random choices (the
// seed is printed); the faults' timing still varies with the machine.
func TestChaos(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "ip", "iptables", "iptables-save", "nsenter", "runc")
	f := runForm(t)
	seed := time.Now().UnixNano()
	if v := os.Getenv("LEVERS9_CHAOS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("LEVERS9_CHAOS_SEED=%q: %v", v, err)
		}
	}
	t.Logf("seed=%d (LEVERS9_CHAOS_SEED repeats it)", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6c3973))
	runN, _ := crand.Int(crand.Reader, big.NewInt(0x10000))
	start := time.Now()
	w := setup(t, fmt.Sprintf("%04x", runN.Int64())[:4])
	t.Logf("stack up in %s", time.Since(start).Round(time.Millisecond))

	base := make([]usage, len(w.replicas))
	for i, r := range w.replicas {
		u, err := r.usage()
		if err != nil {
			t.Fatal(err)
		}
		base[i] = u
	}

	jobs := pick(rng, f.tasks)
	ctx, cancel := context.WithTimeout(context.Background(), f.duration+f.drain+3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	submitted := make(chan struct{})
	go func() {
		defer close(submitted)
		for _, j := range jobs {
			wg.Add(1)
			go func() { defer wg.Done(); j.run(ctx, w.clients[j.via]) }()
			select {
			case <-time.After(f.submitEvery):
			case <-ctx.Done():
			}
		}
	}()

	fl := &faulter{w: w, rng: rng, redisDown: f.redisDown, dropFor: f.dropFor, count: map[fault]int{},
		log: func(format string, args ...any) {
			t.Logf("%6.1fs "+format, append([]any{time.Since(start).Seconds()}, args...)...)
		}}
	gap := func() { time.Sleep(f.gapMin + time.Duration(rng.Int64N(int64(f.gapMax-f.gapMin)))) }
	if f.duration > 0 {
		for end := time.Now().Add(f.duration); time.Now().Before(end); {
			gap()
			fl.inject(t, fault(rng.IntN(int(faultKinds))))
		}
	} else {
		for _, k := range fl.plan(f.extraFaults) {
			gap()
			fl.inject(t, k)
		}
	}
	fl.log("faults done: %s", fl.summary())
	// Restarted agents are back before the end: the leak check is of
	// agents that stop cleanly, not of one stopped while it starts.
	w.waitOnline(t, 2*time.Minute)
	<-submitted
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(f.drain):
		cancel()
		<-done
	}
	fl.log("all tasks followed to their end")

	v := verdict{start: start}
	attempts := 0
	for _, j := range jobs {
		v.check(j)
		attempts += len(j.final.GetAttempts())
	}
	for _, p := range v.problems {
		t.Error(p)
	}
	t.Logf("attempts=%d for %d tasks; wrong=%d overlapped=%d gaps=%d", attempts, len(jobs), v.wrong, v.overlapped, v.gaps)
	t.Logf("attempts given up, by why: %s", lostWhy(jobs))

	// The controlplanes back near their baseline once the clients left.
	for _, c := range w.clients {
		c.Close()
	}
	for i, r := range w.replicas {
		var now usage
		ok := false
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			var err error
			if now, err = r.usage(); err == nil && near(base[i], now) {
				ok = true
				break
			}
		}
		t.Logf("%s: goroutines %v -> %v, heap in use %.1f -> %.1f MiB", r.name, base[i].goroutines, now.goroutines, base[i].heap/(1<<20), now.heap/(1<<20))
		if !ok {
			t.Errorf("%s did not go back near its baseline: goroutines %v -> %v, heap %.1f -> %.1f MiB", r.name, base[i].goroutines, now.goroutines, base[i].heap/(1<<20), now.heap/(1<<20))
		}
	}

	// Nothing left on the nodes once the agents stop cleanly.
	leaked := 0
	for _, a := range w.agents {
		a.stop()
		for _, l := range a.leaks() {
			leaked++
			t.Errorf("agent %s (%s) left %s", a.id, a.prefix, l)
		}
	}
	fmt.Printf("tasks=%d lost=%d duplicated=%d leaked=%d faults=%d\n", len(jobs), v.lost, v.duplicated, leaked, fl.total())
}
