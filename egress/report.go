package egress

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/levers9/levers9/internal/clock"
)

// Readiness aggregates, per pool, what the egress chains refused or (in
// observe mode) would have refused over a sliding window: exact counts by
// class and task from the rule counters, and sampled destinations from the
// rate-limited log. It is safe for concurrent use.
type Readiness struct {
	window time.Duration
	clock  clock.Clock

	// mu guards buckets.
	mu      sync.Mutex
	buckets map[int64]*readinessBucket // by unix minute
}

type readinessBucket struct {
	counts  map[countKey]uint64
	samples map[sampleKey]uint64
}

type countKey struct{ pool, task, class string }
type sampleKey struct{ pool, task, class, dest string }

// NewReadiness returns an aggregator over window on clock c (nil: the
// wall clock).
func NewReadiness(window time.Duration, c clock.Clock) *Readiness {
	return &Readiness{window: window, clock: clock.OrReal(c), buckets: map[int64]*readinessBucket{}}
}

func (r *Readiness) bucketLocked() *readinessBucket {
	t := r.clock.Now()
	m := t.Unix() / 60
	b := r.buckets[m]
	if b == nil {
		b = &readinessBucket{counts: map[countKey]uint64{}, samples: map[sampleKey]uint64{}}
		r.buckets[m] = b
		oldest := t.Add(-r.window).Unix() / 60
		for k := range r.buckets {
			if k < oldest {
				delete(r.buckets, k)
			}
		}
	}
	return b
}

// AddCount records n counted matches.
func (r *Readiness) AddCount(pool, task, class string, n uint64) {
	if n == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bucketLocked().counts[countKey{pool, task, class}] += n
}

// AddSample records one logged match with its destination.
func (r *Readiness) AddSample(pool, task, class, dest string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bucketLocked().samples[sampleKey{pool, task, class, dest}]++
}

// ClassCount, TaskCount and DestinationSample are report rows.
type ClassCount struct {
	Class string `json:"class"`
	Count uint64 `json:"count"`
}

type TaskCount struct {
	Task  string `json:"task"`
	Class string `json:"class"`
	Count uint64 `json:"count"`
}

type DestinationSample struct {
	Class       string `json:"class"`
	Destination string `json:"destination"`
	Task        string `json:"task"`
	Samples     uint64 `json:"samples"`
}

// Report is what would have been refused in one pool over the window. The
// counts are exact (rule counters, about one per connection attempt since
// established traffic is accepted first); destinations are samples from
// the rate-limited log.
type Report struct {
	Pool          string              `json:"pool"`
	Mode          Mode                `json:"mode,omitempty"`
	From          time.Time           `json:"from"`
	To            time.Time           `json:"to"`
	Total         uint64              `json:"total"`
	ByClass       []ClassCount        `json:"byClass"`
	ByTask        []TaskCount         `json:"byTask"`
	Destinations  []DestinationSample `json:"destinations"`
	SafeToEnforce bool                `json:"safeToEnforce"`
	// Blind, when set, says why this node's counters cannot see its
	// containers' traffic; the report then proves nothing and
	// SafeToEnforce is false.
	Blind string `json:"blind,omitempty"`
}

// Report builds the report for pool.
func (r *Readiness) Report(pool string, mode Mode) Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	oldest := now.Add(-r.window).Unix() / 60
	classes := map[string]uint64{}
	tasks := map[countKey]uint64{}
	dests := map[sampleKey]uint64{}
	rep := Report{Pool: pool, Mode: mode, From: now.Add(-r.window).UTC(), To: now.UTC()}
	for m, b := range r.buckets {
		if m < oldest {
			continue
		}
		for k, n := range b.counts {
			if k.pool != pool {
				continue
			}
			classes[k.class] += n
			tasks[countKey{task: k.task, class: k.class}] += n
			rep.Total += n
		}
		for k, n := range b.samples {
			if k.pool == pool {
				dests[sampleKey{task: k.task, class: k.class, dest: k.dest}] += n
			}
		}
	}
	for c, n := range classes {
		rep.ByClass = append(rep.ByClass, ClassCount{c, n})
	}
	sort.Slice(rep.ByClass, func(i, j int) bool {
		a, b := rep.ByClass[i], rep.ByClass[j]
		return a.Count > b.Count || a.Count == b.Count && a.Class < b.Class
	})
	for k, n := range tasks {
		rep.ByTask = append(rep.ByTask, TaskCount{k.task, k.class, n})
	}
	sort.Slice(rep.ByTask, func(i, j int) bool {
		a, b := rep.ByTask[i], rep.ByTask[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.Task+a.Class < b.Task+b.Class
	})
	for k, n := range dests {
		rep.Destinations = append(rep.Destinations, DestinationSample{k.class, k.dest, k.task, n})
	}
	sort.Slice(rep.Destinations, func(i, j int) bool {
		a, b := rep.Destinations[i], rep.Destinations[j]
		if a.Samples != b.Samples {
			return a.Samples > b.Samples
		}
		return a.Class+a.Destination+a.Task < b.Class+b.Destination+b.Task
	})
	rep.SafeToEnforce = rep.Total == 0 && len(rep.Destinations) == 0
	return rep
}

// JSON renders the report for the API.
func (rep Report) JSON() ([]byte, error) { return json.MarshalIndent(rep, "", "  ") }

// Text renders the report for `levers9 security report --pool NAME`.
func (rep Report) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pool %s (mode %s), %s to %s\n", rep.Pool, rep.Mode,
		rep.From.Format(time.RFC3339), rep.To.Format(time.RFC3339))
	if rep.Blind != "" {
		fmt.Fprintf(&b, "safe to enforce: unknown: %s\n", rep.Blind)
	}
	if rep.SafeToEnforce {
		b.WriteString("nothing would have been refused: enforce is safe for this window\n")
		return b.String()
	}
	fmt.Fprintf(&b, "%d connection attempts would have been refused\n\n", rep.Total)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLASS\tCOUNT")
	for _, c := range rep.ByClass {
		fmt.Fprintf(tw, "%s\t%d\n", c.Class, c.Count)
	}
	fmt.Fprintln(tw, "\nTASK\tCLASS\tCOUNT")
	for _, t := range rep.ByTask {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", t.Task, t.Class, t.Count)
	}
	fmt.Fprintln(tw, "\nCLASS\tDESTINATION\tTASK\tSAMPLES")
	for _, d := range rep.Destinations {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", d.Class, d.Destination, d.Task, d.Samples)
	}
	_ = tw.Flush()
	return b.String()
}
