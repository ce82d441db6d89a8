// Package taskrun owns the agent's task lifecycle on one node: it turns a
// Task (an attempt of a user's task, as the controlplane hands it down) into
// a running container and back into a result. It pulls the image through the
// content-addressed cache, mounts the task's own overlay rootfs, attaches the
// container to the node's egress network, starts it with the pool's runtime
// and effective security, streams its output through bounded buffers, and
// reports the exit. It never imports the controlplane or the API types: the
// agent translates between them and this package.
//
// A Runner is built from hooks, nomad style: each hook has a Name and
// implements only the phases it needs (Prestarter, Poststarter, Prekiller,
// Exiter, Stopper). The built-in ones are the image hook (pull, user
// check, overlay rootfs), the network hook (egress attach and detach), the
// volume hook, the io hook (the attempt's /run/levers9/io: the task's input
// in, its result out, read after exit as a file the container controlled)
// and the logs hook (bounded output); Config.Hooks adds more. Prestart hooks
// run in order before the container starts and fill in what the container
// needs (rootfs, network namespace, stdio); Stop hooks run in reverse
// order once the container is deleted. Every hook is idempotent: a second
// Prestart returns what the first did, a second Stop is a no-op.
//
// A task attempt moves through these states; any other move is refused
// with an error (see State.Next):
//
//	PENDING --> PULLING --> STARTING --> RUNNING --> SUCCEEDED
//	   |           |            |           |------> FAILED
//	   |           |            |           |------> CANCELLED
//	   |           |            |           +------> TIMED_OUT
//	   +-----------+------------+--> FAILED | CANCELLED
//
// Output: the container's stdout and stderr are pipes read by the agent
// into one bounded queue per attempt (Config.LogBuffer lines of at most
// Config.MaxLineBytes), pumped into the caller's LogSink from its own
// goroutine. Writing never blocks the container: when the sink falls
// behind, the oldest queued lines are dropped, counted, and the gap is
// marked on the next delivered line (LogLine.DroppedBefore). Lines keep
// their order within a stream; between the two streams they are in the
// order the agent read them. Every line delivered precedes the attempt's
// terminal state event.
//
// Run refuses an attempt (task ID and attempt number) that is already
// running, and Attempts lists what runs, so an agent that reconnects can
// tell the controlplane and nothing starts twice.
//
// Two contexts, as in nomad's killCtx and shutdownCtx. The context given
// to Run is the kill context: when it ends the container gets SIGTERM, then
// SIGKILL after the grace period, and its network, rootfs and state are
// removed (CANCELLED; a Task.Timeout ends as TIMED_OUT the same way). The
// context given to Runner.Start is the shutdown context: when it ends (or
// Stop is called) every Run returns ErrDetached at once and leaves its
// container, network and rootfs in place, so an agent upgrade does not kill
// users' work. The container is no child of the agent (sandbox.OCI runs
// it under a setsid holder that writes its output and exit status to
// files), so it outlives the agent's exit, SIGKILL included. An attempt
// that had not started its container when shutdown came is cleaned up and
// also returns ErrDetached, in a non-terminal state.
//
// A restarted agent calls Recover: attempts whose record (Config.StateDir)
// and container both survived are kept, with their rootfs and network, and
// returned; Resume goes on with each from RUNNING, reading the output files
// from the offsets the previous agent had shipped (Shipped, saved with
// SaveShipped after each acknowledgement; LogLine.End is a line's offset),
// with the timeout counted from the original start. Everything else is
// removed and the attempts it had records of are returned as Lost.
//
// A FAILED Result carries a Reason when its exit code does not say why:
// the hook or runtime that could not start the program marks its error
// (image_not_found, image_pull_failed, mount_failed, network_failed,
// start_failed), and at exit the container cgroup's counters
// (sandbox.Handle.LimitKills) say whether the memory or pids limit killed
// it (out_of_memory, pids_limit). Result.Summary is one sentence for
// people; the error keeps the chain.
//
// It must never block a container on its output, kill a container on
// shutdown, leave a rootfs mount, network namespace, io directory or
// container state behind after a terminal state, follow a link or block on
// a FIFO the container left as its result, or report security the runtime did not
// apply (it forwards sandbox.Handle.Effective, with the egress mode the
// network hook really attached the container with).
//
// API stability: experimental, internal to the agent. Runner, Task, Hook
// and the phase interfaces, Event, LogLine, Lost, Recovered and Shipped
// are what the agent calls; fields may be added.
package taskrun
