package taskrun

import (
	"time"

	"github.com/levers9/levers9/sandbox"
)

// EventKind says what an Event reports.
type EventKind string

// The event kinds.
const (
	// EventState is a state change (From, To; Err on FAILED).
	EventState EventKind = "state"
	// EventSecurity carries the security the runtime really applied,
	// once the container started.
	EventSecurity EventKind = "security"
	// EventExited is the container's exit, sent before its output is
	// drained and the attempt cleaned up.
	EventExited EventKind = "exited"
	// EventDroppedLines reports how many output lines were lost to full
	// buffers; sent at exit when any were.
	EventDroppedLines EventKind = "dropped_lines"
)

// Event is one thing that happened to an attempt.
type Event struct {
	Kind    EventKind
	TaskID  string
	Attempt int
	Time    time.Time
	From    State
	To      State
	// Err says why an attempt FAILED before its container ran.
	Err          string
	Effective    *sandbox.Effective
	Exit         *sandbox.ExitStatus
	DroppedLines uint64
	// Phases is where the start went, on the change to RUNNING: each
	// prestart hook by its name, then the sandbox's "prepare", "create"
	// and "start".
	Phases []Phase
}

// Phase is one part of an attempt's start and the time it took.
type Phase struct {
	Name string
	Took time.Duration
}
