package taskrun

import (
	"fmt"

	"github.com/levers9/levers9/internal/errdefs"
)

// State is where one task attempt is in its lifecycle (see the package doc
// for the diagram).
type State string

// The states. The last four are terminal.
const (
	StatePending   State = "PENDING"
	StatePulling   State = "PULLING"
	StateStarting  State = "STARTING"
	StateRunning   State = "RUNNING"
	StateSucceeded State = "SUCCEEDED"
	StateFailed    State = "FAILED"
	StateCancelled State = "CANCELLED"
	StateTimedOut  State = "TIMED_OUT"
)

// transitions lists every legal move.
var transitions = map[State][]State{
	StatePending:  {StatePulling, StateFailed, StateCancelled},
	StatePulling:  {StateStarting, StateFailed, StateCancelled},
	StateStarting: {StateRunning, StateFailed, StateCancelled},
	StateRunning:  {StateSucceeded, StateFailed, StateCancelled, StateTimedOut},
}

// Terminal reports whether no move leaves s.
func (s State) Terminal() bool {
	switch s {
	case StateSucceeded, StateFailed, StateCancelled, StateTimedOut:
		return true
	}
	return false
}

// Valid reports whether s is one of the states.
func (s State) Valid() bool {
	_, ok := transitions[s]
	return ok || s.Terminal()
}

// Next checks the move from s to to and returns to, or an
// ErrFailedPrecondition error naming both states.
func (s State) Next(to State) (State, error) {
	if !s.Valid() || !to.Valid() {
		return s, fmt.Errorf("task state %q -> %q: unknown state: %w", s, to, errdefs.ErrInvalidArgument)
	}
	for _, ok := range transitions[s] {
		if ok == to {
			return to, nil
		}
	}
	return s, fmt.Errorf("task state %s -> %s: illegal transition: %w", s, to, errdefs.ErrFailedPrecondition)
}
