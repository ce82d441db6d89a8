// Package agent owns the node agent: joining (enrollment with a join token
// and a key that never leaves the machine), its state directory, the tunnel
// client, inventory and heartbeats, and the tasks it runs for the
// controlplane: RunTask, CancelTask and ListTasks served over the tunnel,
// backed by agent/taskrun, with each attempt's progress sent back through
// ReportAttempt as numbered records (RUNNING, output lines, seccomp
// log-mode totals, the terminal state) that are resent until
// acknowledged, so a controlplane restart loses nothing, and whose unsent output is bounded (the oldest lines go,
// counted). An attempt is held, and listed in every heartbeat, from the
// RunTask that took it until its terminal record is acknowledged. Under
// seccomp log mode (SeccompWatch) it reads the kernel log for the syscalls
// enforce would refuse and attributes them to attempts.
//
// It keeps one Prometheus registry (Metrics: egress, image cache, task
// starts, seccomp log events, tunnel) and sends snapshots of what changed
// over the tunnel; the controlplane serves them.
//
// A restarted agent holds again the attempts whose containers the previous
// one left running and reports them from the record after the last one
// acknowledged. The lease: with no heartbeat answered for longer than the
// controlplane's lostAgentGrace, the agent kills its attempts' containers.
//
// It dials out and never listens on a network port. It never imports the
// controlplane; it talks to it only through api/ over the tunnel or the
// enrollment call. API: internal to the agent binary.
package agent
