package cli

import (
	"fmt"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// printTaskSeccomp is task show's "Seccomp (log mode)" block: the syscalls
// the pool's seccomp log mode let through that enforce would refuse.
// Nothing is printed for a task that made none.
func (a *app) printTaskSeccomp(t *v1.Task) {
	if len(t.GetSeccompLogged()) == 0 {
		return
	}
	fmt.Fprintln(a.io.Out, "\nSeccomp (log mode): syscalls enforce would refuse")
	w := newTab(a)
	fmt.Fprintln(w, "SYSCALL\tCOUNT")
	for _, c := range t.GetSeccompLogged() {
		fmt.Fprintf(w, "%s\t%d\n", c.GetSyscall(), c.GetCount())
	}
	w.Flush()
}

// printSeccompReport is security report's seccomp block.
func (a *app) printSeccompReport(r *v1.SeccompReport) error {
	if r == nil {
		return nil
	}
	verdict := "no: see below"
	switch {
	case r.GetMode() == "enforce" && r.GetTasksObserved() == 0:
		verdict = "already enforced"
	case r.GetMode() != "log" && r.GetTasksObserved() == 0:
		verdict = fmt.Sprintf("unknown: the pool's seccomp mode is %s; set it to log to find out", r.GetMode())
	case r.GetTasksObserved() == 0:
		verdict = "unknown: no task ran under log mode yet"
	case r.GetSafeToEnforce():
		verdict = "yes: no task made a syscall enforce would refuse"
	}
	fmt.Fprintf(a.io.Out, "\nseccomp mode %s, %d task(s) observed under log mode (last 7 days)\n", r.GetMode(), r.GetTasksObserved())
	fmt.Fprintf(a.io.Out, "seccomp safe to enforce: %s\n", verdict)
	if len(r.GetSyscalls()) == 0 {
		return nil
	}
	w := newTab(a)
	fmt.Fprintln(w, "SYSCALL\tCOUNT\tTASKS\tTASK IDS")
	for _, c := range r.GetSyscalls() {
		ids := ""
		for i, id := range c.GetTaskIds() {
			if i > 0 {
				ids += ","
			}
			ids += id
		}
		if more := int(c.GetTasks()) - len(c.GetTaskIds()); more > 0 {
			ids += fmt.Sprintf(" (+%d)", more)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", c.GetSyscall(), c.GetCount(), c.GetTasks(), ids)
	}
	return w.Flush()
}

// printTaskMounts is task show's "Volume mounts (log mode)" block: the
// mounts volume mount validation's log mode let through that enforce would
// refuse. Nothing is printed for a task that had none.
func (a *app) printTaskMounts(t *v1.Task) {
	if len(t.GetMountFindings()) == 0 {
		return
	}
	fmt.Fprintln(a.io.Out, "\nVolume mounts (log mode): enforce would refuse")
	w := newTab(a)
	fmt.Fprintln(w, "VOLUME\tPATH\tWHY")
	for _, f := range t.GetMountFindings() {
		fmt.Fprintf(w, "%s\t%s\t%s\n", f.GetVolume(), f.GetPath(), f.GetReason())
	}
	w.Flush()
}

// printMountReport is security report's volume mount block.
func (a *app) printMountReport(r *v1.MountReport) error {
	if r == nil {
		return nil
	}
	verdict := "no: see below"
	switch {
	case r.GetMode() == "enforce" && r.GetTasksWithFindings() == 0:
		verdict = "already enforced"
	case r.GetTasksWithVolumes() == 0:
		verdict = "unknown: no task mounted a volume yet"
	case r.GetSafeToEnforce():
		verdict = "yes: no task mounted a volume where enforce would refuse it"
	}
	fmt.Fprintf(a.io.Out, "\nvolume mount validation %s, %d task(s) with volumes, %d with a mount enforce would refuse (last 7 days)\n",
		r.GetMode(), r.GetTasksWithVolumes(), r.GetTasksWithFindings())
	fmt.Fprintf(a.io.Out, "volume mounts safe to enforce: %s\n", verdict)
	if len(r.GetFindings()) == 0 {
		return nil
	}
	w := newTab(a)
	fmt.Fprintln(w, "TASK\tVOLUME\tPATH\tWHY")
	for _, f := range r.GetFindings() {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", f.GetTaskId(), f.GetFinding().GetVolume(), f.GetFinding().GetPath(), f.GetFinding().GetReason())
	}
	return w.Flush()
}
