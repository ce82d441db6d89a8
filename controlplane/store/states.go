package store

import (
	"fmt"

	"github.com/levers9/levers9/internal/errdefs"
)

// TaskState is tasks.state, a closed set (a CHECK constraint refuses any
// other value). Who moves a task in and out of each state:
//
//	           submit                     scheduler (placement)
//	(none) ──────────────▶ PENDING ─────────────────────────────▶ SCHEDULED
//	                        │  ▲                                   │
//	     cancel (api) ──────┤  └── rescuer / intake: attempt lost  │ intake: the agent
//	                        │      or failed to start on its       │ started it
//	                        │      machine (Reason.MachineFault),  │
//	                        │      retries left                    │
//	                        ▼                                      ▼
//	                    CANCELLED ◀──────────────────────────── RUNNING
//	                    SUCCEEDED, FAILED, TIMED_OUT ◀───────── (SCHEDULED or RUNNING):
//	                                intake (the agent's report), scheduler (the agent
//	                                refused it), rescuer (lost, no retries or cancelled)
//
// The four terminal states are never left. The moves are taskMoves; every
// UPDATE of tasks.state in this package only touches rows in a state the
// table allows to move to the new one.
type TaskState string

// The task states.
const (
	TaskPending   TaskState = "PENDING"
	TaskScheduled TaskState = "SCHEDULED"
	TaskRunning   TaskState = "RUNNING"
	TaskSucceeded TaskState = "SUCCEEDED"
	TaskFailed    TaskState = "FAILED"
	TaskCancelled TaskState = "CANCELLED"
	TaskTimedOut  TaskState = "TIMED_OUT"
)

// AttemptState is task_attempts.state, a closed set. An attempt is made
// SCHEDULED by the scheduler's placement; the intake moves it to RUNNING
// and to its end as its agent reports; the rescuer (or the intake, when the
// agent says so) moves an active one to LOST. Only SCHEDULED and RUNNING
// hold resources on their machine.
type AttemptState string

// The attempt states.
const (
	AttemptScheduled AttemptState = "SCHEDULED"
	AttemptRunning   AttemptState = "RUNNING"
	AttemptSucceeded AttemptState = "SUCCEEDED"
	AttemptFailed    AttemptState = "FAILED"
	AttemptCancelled AttemptState = "CANCELLED"
	AttemptTimedOut  AttemptState = "TIMED_OUT"
	AttemptLost      AttemptState = "LOST"
)

var (
	taskEnds    = []TaskState{TaskSucceeded, TaskFailed, TaskCancelled, TaskTimedOut}
	attemptEnds = []AttemptState{AttemptSucceeded, AttemptFailed, AttemptCancelled, AttemptTimedOut, AttemptLost}

	// taskMoves lists, for each state, the states a task may move to.
	taskMoves = map[TaskState][]TaskState{
		TaskPending:   {TaskScheduled, TaskCancelled},
		TaskScheduled: append([]TaskState{TaskRunning, TaskPending}, taskEnds...),
		TaskRunning:   append([]TaskState{TaskPending}, taskEnds...),
		TaskSucceeded: nil, TaskFailed: nil, TaskCancelled: nil, TaskTimedOut: nil,
	}
	// attemptMoves lists, for each state, the states an attempt may move to.
	attemptMoves = map[AttemptState][]AttemptState{
		AttemptScheduled: append([]AttemptState{AttemptRunning}, attemptEnds...),
		AttemptRunning:   attemptEnds,
		AttemptSucceeded: nil, AttemptFailed: nil, AttemptCancelled: nil, AttemptTimedOut: nil, AttemptLost: nil,
	}
)

// TaskStates is every task state, in lifecycle order.
func TaskStates() []TaskState {
	return []TaskState{TaskPending, TaskScheduled, TaskRunning, TaskSucceeded, TaskFailed, TaskCancelled, TaskTimedOut}
}

// AttemptStates is every attempt state, in lifecycle order.
func AttemptStates() []AttemptState {
	return []AttemptState{AttemptScheduled, AttemptRunning, AttemptSucceeded, AttemptFailed, AttemptCancelled, AttemptTimedOut, AttemptLost}
}

// Valid reports whether s is one of the task states.
func (s TaskState) Valid() bool { _, ok := taskMoves[s]; return ok }

// Terminal reports whether nothing leaves s.
func (s TaskState) Terminal() bool { return s.Valid() && len(taskMoves[s]) == 0 }

// Active reports whether a task in s holds a machine (an attempt is placed).
func (s TaskState) Active() bool { return s == TaskScheduled || s == TaskRunning }

// CanMove returns nil when a task may move from s to to, and an error
// naming both otherwise.
func (s TaskState) CanMove(to TaskState) error {
	for _, t := range taskMoves[s] {
		if t == to {
			return nil
		}
	}
	return fmt.Errorf("task state %s cannot move to %s: %w", s, to, errdefs.ErrFailedPrecondition)
}

// sources are the states from which a task may move to s: the WHERE of an
// UPDATE that moves tasks to s.
func (s TaskState) sources() []string {
	var out []string
	for _, from := range TaskStates() {
		if from.CanMove(s) == nil {
			out = append(out, string(from))
		}
	}
	return out
}

// Valid reports whether s is one of the attempt states.
func (s AttemptState) Valid() bool { _, ok := attemptMoves[s]; return ok }

// Terminal reports whether nothing leaves s.
func (s AttemptState) Terminal() bool { return s.Valid() && len(attemptMoves[s]) == 0 }

// Active reports whether an attempt in s holds resources on its machine.
func (s AttemptState) Active() bool { return s == AttemptScheduled || s == AttemptRunning }

// CanMove returns nil when an attempt may move from s to to.
func (s AttemptState) CanMove(to AttemptState) error {
	for _, t := range attemptMoves[s] {
		if t == to {
			return nil
		}
	}
	return fmt.Errorf("attempt state %s cannot move to %s: %w", s, to, errdefs.ErrFailedPrecondition)
}

// sources are the states from which an attempt may move to s.
func (s AttemptState) sources() []string {
	var out []string
	for _, from := range AttemptStates() {
		if from.CanMove(s) == nil {
			out = append(out, string(from))
		}
	}
	return out
}

// TaskEnd is the task state an attempt's end gives its task; ok is false
// for LOST (the task's next state depends on its retries) and for active
// states.
func (s AttemptState) TaskEnd() (TaskState, bool) {
	switch s {
	case AttemptSucceeded:
		return TaskSucceeded, true
	case AttemptFailed:
		return TaskFailed, true
	case AttemptCancelled:
		return TaskCancelled, true
	case AttemptTimedOut:
		return TaskTimedOut, true
	}
	return "", false
}

// SQL spellings of the sets that partial indexes are defined on, built
// from the constants: a literal lets the planner match those indexes, where
// a parameter would not once the statement's plan is cached.
const (
	sqlActiveAttempts = "('" + string(AttemptScheduled) + "', '" + string(AttemptRunning) + "')"
	sqlActiveTasks    = "('" + string(TaskScheduled) + "', '" + string(TaskRunning) + "')"
	sqlPending        = "'" + string(TaskPending) + "'"
)

// Reason is task_attempts.reason: why an attempt failed when its exit code
// does not say it, a closed set (a CHECK constraint refuses any other
// value). The agent that ran the attempt gives it; the intake stores it.
//
//	reason             the program ran?  exit code  the task
//	ReasonNone         yes               yes        ends with the attempt
//	start_failed       no                none       PENDING again while retries remain (the machine's fault)
//	mount_failed       no                none       PENDING again while retries remain (the machine's fault)
//	network_failed     no                none       PENDING again while retries remain (the machine's fault)
//	image_not_found    no                none       FAILED at once (no machine would find it)
//	image_pull_failed  no                none       FAILED
//	out_of_memory      yes (killed)      kept       ends with the attempt
//	pids_limit         yes               kept       ends with the attempt
type Reason string

// The reasons.
const (
	ReasonNone            Reason = ""
	ReasonStartFailed     Reason = "start_failed"
	ReasonImageNotFound   Reason = "image_not_found"
	ReasonImagePullFailed Reason = "image_pull_failed"
	ReasonMountFailed     Reason = "mount_failed"
	ReasonNetworkFailed   Reason = "network_failed"
	ReasonOutOfMemory     Reason = "out_of_memory"
	ReasonPidsLimit       Reason = "pids_limit"
)

// Reasons is every reason, in the order of the CHECK constraint.
func Reasons() []Reason {
	return []Reason{ReasonNone, ReasonStartFailed, ReasonImageNotFound, ReasonImagePullFailed, ReasonMountFailed,
		ReasonNetworkFailed, ReasonOutOfMemory, ReasonPidsLimit}
}

// Valid reports whether r is one of the reasons.
func (r Reason) Valid() bool {
	for _, k := range Reasons() {
		if r == k {
			return true
		}
	}
	return false
}

// NotStarted reports whether the program never ran: the attempt has no
// exit code.
func (r Reason) NotStarted() bool {
	switch r {
	case ReasonStartFailed, ReasonImageNotFound, ReasonImagePullFailed, ReasonMountFailed, ReasonNetworkFailed:
		return true
	}
	return false
}

// MachineFault reports whether another machine may well succeed: the
// attempt uses a retry like a lost one.
func (r Reason) MachineFault() bool {
	switch r {
	case ReasonStartFailed, ReasonMountFailed, ReasonNetworkFailed:
		return true
	}
	return false
}
