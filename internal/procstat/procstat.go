// Package procstat owns reading a process's /proc/PID/stat: its state and
// start time, which tell a live process from one that exited and waits to
// be reaped, and from a later process given the same pid.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat is what callers need of /proc/PID/stat.
type Stat struct {
	// State is the one-letter state: R, S, D, Z (exited, not reaped yet),
	// X (dead), …
	State byte
	// StartTime is when the process started, in clock ticks after boot:
	// with the pid, it names one process.
	StartTime uint64
}

// Exited reports whether the process has ended (a zombie or dead).
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// Read reads the process's stat; an error when there is no such process.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	return parse(pid, string(b))
}

func parse(pid int, s string) (Stat, error) {
	// The state follows the command name, which is in parentheses and may
	// hold spaces or parentheses itself.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: start time: %w", pid, err)
	}
	return Stat{State: f[0][0], StartTime: start}, nil
}
