// Package sandbox owns turning a task and its pool's security settings into
// an OCI runtime spec, and running that spec with runc or runsc (gVisor):
// Docker's default capabilities and seccomp profile resolved for the
// container, masked and read-only paths, no-new-privileges, AppArmor where the
// node has it (and the levers9-default profile, embedded and loaded with
// apparmor_parser by LoadAppArmor), NVIDIA GPU devices, volume mount validation, and the seccomp
// log-mode reader that attributes kernel audit records to tasks, and reading
// a container cgroup's memory and pids event counters after it exits
// (Handle.LimitKills; runc runs with --keep so the cgroup outlives the
// process until Delete). Containers run under a holder process in their own
// session, with output and exit status in files, so they outlive the agent
// and a restarted agent can adopt them (Sandbox.Reattach).
//
// A task's secret environment (TaskSpec.SecretEnv) reaches the container's
// process and nothing else the sandbox keeps: the bundle holds it only
// until the runtime started the container, and it is never logged.
//
// It must never loosen what a pool asks for (a task may only tighten), never
// report a control as applied when the runtime ignores it (Effective is read
// from the final spec, with the seccomp profile's hash as written to the
// bundle, never from the request),
// never ask a spec for more open files than the host's hard limit, and never
// import the controlplane or another levers9 part. Runtimes are driven as
// binaries; libcontainer is not imported.
//
// The image cache lives in the subpackage sandbox/image.
//
// API stability: experimental. Security, TaskSpec, BuildSpec, Runtime and
// Sandbox are what the agent calls; fields may be added, existing ones keep
// their meaning.
package sandbox
