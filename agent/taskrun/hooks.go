package taskrun

import (
	"context"
	"io"

	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
)

// Hook is one part of a task's lifecycle. It implements any of Prestarter,
// Poststarter, Prekiller, Exiter and Stopper besides Name. A Runner makes one set of
// hooks per attempt, so a hook may keep that attempt's state in itself.
//
// Contract: every phase method is idempotent (a second call returns what
// the first did, or does nothing), honours ctx, and is called from one
// goroutine at a time.
type Hook interface {
	// Name names the hook in logs and errors.
	Name() string
}

// Prestarter runs before the container is created, in hook order (but
// see besideImage). It may block (an image pull). An error fails the
// attempt; the Stop phase still runs for every hook.
type Prestarter interface {
	Hook
	Prestart(ctx context.Context, req *PrestartRequest, resp *PrestartResponse) error
}

// besideImage marks a Prestarter of this package that reads neither
// PrestartRequest.Image nor Rootfs (the image hook, which provides them,
// is one): these run their Prestart at the same time, each on its own copy
// of the request, so that a pull, a volume mount and the network
// attachment overlap instead of adding up.
type besideImage interface {
	Prestarter
	besideImage()
}

// PrestartRequest is what a prestart hook sees: the task, the container ID
// and the responses of the hooks before it.
type PrestartRequest struct {
	Task        Task
	ContainerID string
	// Image and Rootfs are set once the image hook ran.
	Image  *image.Image
	Rootfs string
}

// PrestartResponse is what a prestart hook contributes to the container.
// Zero fields leave what earlier hooks set.
type PrestartResponse struct {
	// Image and Rootfs come from the image hook.
	Image  *image.Image
	Rootfs string
	// NetNSPath is the network namespace to join ("" is a fresh one with
	// only loopback).
	NetNSPath string
	// EgressMode is the egress mode the network hook attached the
	// container with ("" without a node: the sandbox reports none).
	EgressMode string
	// Mounts are the agent's own bind mounts (resolv.conf). They reach the
	// sandbox as TaskSpec.AgentMounts, which the volume validation does not
	// judge: never put a mount a task asked for here.
	Mounts []sandbox.Mount
	// Stdout and Stderr receive the container's output. They must never
	// block.
	Stdout, Stderr io.Writer
}

// Poststarter runs once the container has started, in hook order. An
// error is logged and does not stop the task.
type Poststarter interface {
	Hook
	Poststart(ctx context.Context, req *PoststartRequest) error
}

// PoststartRequest describes the started container.
type PoststartRequest struct {
	Task      Task
	Container string
	Effective sandbox.Effective
}

// Prekiller runs before the Runner signals a container it kills (cancel or
// timeout), in hook order, bounded by ctx. An error is logged and the kill
// goes on.
type Prekiller interface {
	Hook
	Prekill(ctx context.Context, req *PrekillRequest) error
}

// PrekillRequest says which container is about to be killed and why.
type PrekillRequest struct {
	Task      Task
	Container string
	// Reason is StateCancelled or StateTimedOut.
	Reason State
}

// Exiter runs once the container's process has exited (or was killed),
// before the container is deleted, in hook order. It may block briefly
// (draining output), bounded by ctx.
type Exiter interface {
	Hook
	Exited(ctx context.Context, req *ExitedRequest, resp *ExitedResponse) error
}

// ExitedRequest says how the container ended.
type ExitedRequest struct {
	Task Task
	Exit sandbox.ExitStatus
}

// ExitedResponse carries what hooks learnt at exit.
type ExitedResponse struct {
	// DroppedLines counts output lines lost to full buffers.
	DroppedLines uint64
	// Result is what the container left in IOPath/result (the io hook).
	Result *ResultFile
}

// Stopper releases what the hook set up. It runs in reverse hook order
// after the container is deleted, on every path (success, failure, kill),
// but not when the Runner detaches at shutdown.
type Stopper interface {
	Hook
	Stop(ctx context.Context, req *StopRequest) error
}

// StopRequest names the attempt being torn down.
type StopRequest struct {
	Task        Task
	ContainerID string
}
