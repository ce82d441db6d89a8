// Package procstat owns reading a process's /proc/PID/stat: its state and
// start time, which tell a live process from one that exited and waits to
// be reaped, and from a later process given the same pid, and the CPU time
// it used.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Stat is what callers need of /proc/PID/stat.
type Stat struct {
	// State is the one-letter state: R, S, D, Z (exited, not reaped yet),
	// X (dead), …
	State byte
	// StartTime is when the process started, in clock ticks after boot:
	// with the pid, it names one process.
	StartTime uint64
	// CPUTicks is the user and system CPU time the process used so far
	// (all its threads), in clock ticks.
	CPUTicks uint64
}

// userHZ is the clock tick of /proc's times: 100 on every architecture Go
// builds Linux for.
const userHZ = 100

// CPU is CPUTicks as a duration.
func (s Stat) CPU() time.Duration { return time.Duration(s.CPUTicks) * (time.Second / userHZ) }

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
	var n [3]uint64
	for i, field := range []struct {
		what string
		at   int
	}{{"utime", 11}, {"stime", 12}, {"start time", 19}} {
		v, err := strconv.ParseUint(f[field.at], 10, 64)
		if err != nil {
			return Stat{}, fmt.Errorf("parse /proc/%d/stat: %s: %w", pid, field.what, err)
		}
		n[i] = v
	}
	return Stat{State: f[0][0], CPUTicks: n[0] + n[1], StartTime: n[2]}, nil
}
