package chaos

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sdk"
)

// verdict is what the checks found, counted for the last line.
type verdict struct {
	lost, duplicated, wrong, overlapped, gaps int
	problems                                  []string
	// start is when the run started, for the times in problems.
	start time.Time
}

func (v *verdict) add(counter *int, format string, args ...any) {
	*counter++
	v.problems = append(v.problems, fmt.Sprintf(format, args...))
}

// expected is the stdout lines one complete attempt of j prints.
func (j *job) expected() []string {
	switch j.kind {
	case kindTimeout, kindCancel:
		return []string{"begin"}
	case kindLines:
		out := []string{"begin"}
		for i := 1; i <= j.lines; i++ {
			out = append(out, "line"+strconv.Itoa(i))
		}
		return append(out, "end")
	}
	return []string{"begin", "end"}
}

// check applies the invariants to one job.
func (v *verdict) check(j *job) {
	name := fmt.Sprintf("task %d (%s, %s)", j.n, j.kind, j.id)
	if j.submitErr != nil {
		v.add(&v.lost, "%s: submit: %v", name, j.submitErr)
		return
	}
	if j.followErr != nil || j.final == nil {
		v.add(&v.lost, "%s: follow: %v", name, j.followErr)
		return
	}
	t := j.final
	// Exactly one final state, the task's, seen by the follower.
	var finals []v1.TaskState
	for _, ev := range j.events {
		if s := ev.GetState(); s != nil && sdk.IsTerminal(s.GetTaskState()) {
			finals = append(finals, s.GetTaskState())
		}
	}
	switch {
	case len(finals) == 0:
		v.add(&v.lost, "%s: the follower saw no final state (task is %s)", name, t.GetState())
	case len(finals) > 1:
		v.add(&v.duplicated, "%s: the follower saw %d final states %v", name, len(finals), finals)
	case finals[0] != t.GetState():
		v.add(&v.wrong, "%s: the follower saw %s, the task is %s", name, finals[0], t.GetState())
	}
	// The true outcome.
	want, code := v1.TaskState_TASK_STATE_SUCCEEDED, 0
	switch j.kind {
	case kindExit:
		want, code = v1.TaskState_TASK_STATE_FAILED, j.code
	case kindTimeout:
		want, code = v1.TaskState_TASK_STATE_TIMED_OUT, -1
	case kindCancel:
		want, code = v1.TaskState_TASK_STATE_CANCELLED, -1
		if j.cancelErr != nil {
			v.add(&v.wrong, "%s: cancel: %v", name, j.cancelErr)
		}
	}
	if t.GetState() != want {
		v.add(&v.wrong, "%s: ended %s (want %s): %s; attempts %s", name, t.GetState(), want, t.GetMessage(), attemptsText(t))
	} else if code >= 0 && (t.ExitCode == nil || int(t.GetExitCode()) != code) {
		v.add(&v.wrong, "%s: exit code %v (want %d)", name, t.ExitCode, code)
	} else if j.kind == kindTimeout && t.ExitCode != nil && t.GetExitCode() != 124 && t.GetExitCode() != 137 {
		// 137: the program (sh as PID 1 ignores SIGTERM) was killed
		// after the stop grace.
		v.add(&v.wrong, "%s: timed out with exit code %d (want 124, 137 or none)", name, t.GetExitCode())
	}
	v.checkAttempts(j, name)
	v.checkLines(j, name)
}

func attemptsText(t *v1.Task) string {
	var parts []string
	for _, a := range t.GetAttempts() {
		parts = append(parts, fmt.Sprintf("#%d %s on %s exit=%v %q", a.GetNumber(), sdk.AttemptStateName(a.GetState()), a.GetMachineId(), a.ExitCode, a.GetMessage()))
	}
	return strings.Join(parts, "; ")
}

// checkAttempts: no attempt ran while another of the same task did.
func (v *verdict) checkAttempts(j *job, name string) {
	as := j.final.GetAttempts()
	for i := 1; i < len(as); i++ {
		prev, cur := as[i-1], as[i]
		if cur.GetStartedAt() == nil {
			continue
		}
		if prev.GetFinishedAt() == nil {
			v.add(&v.overlapped, "%s: attempt %d started while attempt %d had not finished", name, cur.GetNumber(), prev.GetNumber())
			continue
		}
		if cur.GetStartedAt().AsTime().Before(prev.GetFinishedAt().AsTime()) {
			v.add(&v.overlapped, "%s: attempt %d started at %s, before attempt %d finished at %s", name, cur.GetNumber(),
				cur.GetStartedAt().AsTime().Format(time.StampMicro), prev.GetNumber(), prev.GetFinishedAt().AsTime().Format(time.StampMicro))
		}
	}
}

// checkLines: per attempt, the follower saw a prefix of what the attempt
// prints, each line once and in order, gaps exactly where the agent said
// it dropped lines; the last attempt's output is complete (less what it
// counted as dropped).
func (v *verdict) checkLines(j *job, name string) {
	want := j.expected()
	byAttempt := map[int32][]*v1.LogLine{}
	index := map[*v1.LogLine]int{} // -> index in j.events
	for i, ev := range j.events {
		if l := ev.GetLog(); l != nil && l.GetStream() != v1.LogStream_LOG_STREAM_STDERR {
			byAttempt[ev.GetAttempt()] = append(byAttempt[ev.GetAttempt()], l)
			index[l] = i
		}
	}
	as := j.final.GetAttempts()
	for n, lines := range byAttempt {
		next, droppedBefore := 0, uint64(0)
		for _, l := range lines {
			droppedBefore += l.GetDroppedBefore()
			next += int(l.GetDroppedBefore())
			if next < len(want) && l.GetText() == want[next] {
				next++
				continue
			}
			seen := false
			for _, w := range want[:min(next, len(want))] {
				seen = seen || w == l.GetText()
			}
			if seen {
				v.add(&v.duplicated, "%s: attempt %d: %q again (or out of order), expected %q", name, n, l.GetText(), at(want, next))
			} else {
				v.add(&v.gaps, "%s: attempt %d: %q where %q was due", name, n, l.GetText(), at(want, next))
			}
			v.problems = append(v.problems, v.around(j, index[l]))
			return
		}
		if len(as) == 0 || n != as[len(as)-1].GetNumber() {
			continue
		}
		last := as[len(as)-1]
		if droppedBefore > last.GetDroppedLines() {
			v.add(&v.gaps, "%s: attempt %d: lines say %d dropped, the attempt %d", name, n, droppedBefore, last.GetDroppedLines())
		}
		complete := j.kind != kindTimeout && j.kind != kindCancel
		if complete && uint64(len(lines))+last.GetDroppedLines() != uint64(len(want)) {
			v.add(&v.gaps, "%s: attempt %d: saw %d lines + %d dropped of %d", name, n, len(lines), last.GetDroppedLines(), len(want))
		}
	}
	if len(as) > 0 && j.kind != kindCancel && len(byAttempt[as[len(as)-1].GetNumber()]) == 0 && len(j.expected()) > 0 {
		v.add(&v.gaps, "%s: the last attempt %d printed nothing the follower saw", name, as[len(as)-1].GetNumber())
	}
}

// around shows the events the follower saw near index i: what, the
// cursor, the event's time and when it arrived (seconds into the run).
func (v *verdict) around(j *job, i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "events of %s near #%d:", j.id, i)
	for k := max(0, i-45); k < min(len(j.events), i+5); k++ {
		ev := j.events[k]
		what := fmt.Sprintf("state %v", ev.GetState())
		if l := ev.GetLog(); l != nil {
			what = fmt.Sprintf("%q dropped_before=%d", l.GetText(), l.GetDroppedBefore())
		}
		fmt.Fprintf(&b, "\n  #%d attempt %d cursor %s time %.3fs recv %.3fs %s", k, ev.GetAttempt(), ev.GetCursor(),
			ev.GetTime().AsTime().Sub(v.start).Seconds(), j.recv[k].Sub(v.start).Seconds(), what)
	}
	return b.String()
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "(nothing)"
}

// leaks lists what an agent left on its node after a clean stop:
// containers, network namespaces, veths and per-container chains of its
// prefix, mounts under its state directory (overlay roots, FUSE), its
// cgroup parent. The bridge and the base chains stay by design (the next
// agent reuses them; egress.Node's doc) and the box goes with the test.
func (a *agent) leaks() []string {
	var out []string
	roots, _ := filepath.Glob(filepath.Join(a.stateDir(), "containers", "*", "root"))
	roots = append(roots, filepath.Join(a.stateDir(), "containers", "root"))
	for _, root := range roots {
		if _, err := os.Stat(root); err != nil {
			continue
		}
		b, err := exec.Command("runc", "--root", root, "list", "-q").CombinedOutput()
		if err != nil {
			out = append(out, fmt.Sprintf("runc list --root %s: %v %s", root, err, b))
		}
		for _, id := range strings.Fields(string(b)) {
			out = append(out, "container "+id)
		}
	}
	b, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], a.prefix+"-") {
			out = append(out, "netns "+f[0])
		}
	}
	b, _ = exec.Command("ip", "-n", a.box.ns, "-o", "link").Output()
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if strings.HasPrefix(name, a.prefix+"v") || strings.HasPrefix(name, a.prefix+"p") {
			out = append(out, "veth "+name)
		}
	}
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		b, _ = exec.Command("ip", "netns", "exec", a.box.ns, tool).Output()
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, a.prefix+"-c") {
				out = append(out, tool+": "+l)
			}
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, a.root+"/") || strings.Contains(l, "levers9-"+a.prefix) {
			out = append(out, "mount "+l)
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", a.prefix)); err == nil {
		out = append(out, "cgroup /sys/fs/cgroup/"+a.prefix)
	}
	return out
}

// usage is a replica's goroutines and heap in use, from its /metrics.
type usage struct{ goroutines, heap float64 }

func (r *replica) usage() (usage, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return usage{}, err
	}
	defer resp.Body.Close()
	var u usage
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(val, 64)
		switch name {
		case "go_goroutines":
			u.goroutines = f
		case "go_memstats_heap_inuse_bytes":
			u.heap = f
		}
	}
	if u.goroutines == 0 {
		return u, fmt.Errorf("%s: no go_goroutines in /metrics", r.name)
	}
	return u, sc.Err()
}

// near says whether now is back near base: the goroutines within a
// quarter plus 40 (agents' streams come and go), the heap within twice
// plus 64 MiB (the GC has its own schedule).
func near(base, now usage) bool {
	return now.goroutines <= base.goroutines*1.25+40 && now.heap <= base.heap*2+64<<20
}

// lostWhy counts the lost attempts by their message, machine, replica and
// task IDs left out.
func lostWhy(jobs []*job) string {
	ids := regexp.MustCompile(`\b(m|t|rep)_[a-z2-7]+`)
	n := map[string]int{}
	for _, j := range jobs {
		for _, a := range j.final.GetAttempts() {
			if a.GetState() == v1.AttemptState_ATTEMPT_STATE_LOST {
				n[ids.ReplaceAllString(a.GetMessage(), "${1}_…")]++
			}
		}
	}
	var parts []string
	for why, c := range n {
		parts = append(parts, fmt.Sprintf("%d× %s", c, why))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}
