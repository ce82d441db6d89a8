package sandbox

import (
	"context"
	"io"
	"syscall"
)

// Runtime drives one OCI runtime binary (runc or runsc). Every container
// lives under its own state root, so one container's corrupt state cannot
// affect another's and Reconcile can find leftovers by directory.
//
// Lifecycle (Delete is legal from every state and idempotent):
//
//	Create --> created --Start--> running --(exit | Kill)--> stopped
//	   \___________________________________________________/
//	                         Delete
//
// Create and Start return once the step is done; Wait blocks until the
// container's process exits or ctx ends, and may be called many times and
// concurrently. Kill and State never block on the container. Errors carry
// errdefs kinds (ErrNotFound, ErrAlreadyExists, ...) and say through
// errdefs.IsRetryable whether the same call can succeed later. All methods
// are safe for concurrent use on different containers.
type Runtime interface {
	Name() RuntimeName
	Create(ctx context.Context, id string, opts CreateOpts) error
	Start(ctx context.Context, id string) error
	Wait(ctx context.Context, id string) (ExitStatus, error)
	Kill(ctx context.Context, id string, sig syscall.Signal) error
	Delete(ctx context.Context, id string) error
	State(ctx context.Context, id string) (State, error)
}

// CreateOpts describe the container to create.
type CreateOpts struct {
	// Bundle holds config.json; its rootfs path is absolute.
	Bundle string
	// Stdout and Stderr receive the container's output; nil discards it.
	// The container's stdin is /dev/null.
	Stdout, Stderr io.Writer
	// OwnNetwork says the spec joins no existing network namespace; runsc
	// then runs with only its internal loopback (--network=none).
	OwnNetwork bool
	// NetRaw lets runsc offer raw sockets (CAP_NET_RAW is in the spec).
	NetRaw bool
}

// Status is a container's lifecycle state.
type Status string

// The states a Runtime reports.
const (
	StatusCreated Status = "created"
	StatusRunning Status = "running"
	StatusStopped Status = "stopped"
)

// State is a container's status and, while running, its host pid (runc:
// the init process; runsc: the sandbox process).
type State struct {
	ID     string `json:"id"`
	Status Status `json:"status"`
	Pid    int    `json:"pid"`
}

// ExitStatus is how the container's process ended. Code is 128+signal for
// a signal death, like a shell reports it.
type ExitStatus struct {
	Code   int            `json:"code"`
	Signal syscall.Signal `json:"signal,omitempty"`
}
