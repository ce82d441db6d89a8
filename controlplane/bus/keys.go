package bus

import "time"

// Every Redis key and channel levers9 uses, in one place. Redis is never
// the durable truth (Postgres is): losing every key loses live events,
// presence and queue order, never a task, machine or secret. Each entry
// says who owns it (writes it), its lifetime, and whether it is the truth
// for what it holds or a cache of Postgres. Code never spells a key itself;
// it calls these helpers, so a key's shape changes here or nowhere.
//
//	key / channel                        owner            TTL                 kind
//	levers9:events                       api (bus)        capped 100,000      truth (workspace audit feed)
//	levers9:egress-report:<machine>      agents           EgressReportTTL     truth (latest report only)
//	levers9:presence:<machine>           agents           agents.PresenceTTL  truth (which replica holds the tunnel)
//	levers9:replica:<replica>  (chan)    agents           -                   forwarded agent calls to a replica
//	levers9:queue:<pool>  (zset)         tasks submit     none                cache of PENDING rows (rescuer refills)
//	levers9:sched:lock:<pool>            tasks scheduler  SchedulerLockTTL    truth (who schedules the pool now)
//	levers9:sched  (chan)                tasks scheduler  -                   wake-ups between replicas
//	levers9:task:<task>:events (stream)  tasks events     TaskEventsKeep*     truth (output lines; states are cached from Postgres)
//	levers9:task:<task>:acks  (hash)     tasks events     TaskEventsKeep*     truth (last stored record per attempt)
//	levers9:task-events  (chan)          tasks events     -                   "this task's stream grew"
//
// (*) from when the task finishes; no expiry while it runs.

const prefix = "levers9:"

// EventStream is the workspace event stream (see Bus.Publish).
const EventStream = prefix + "events"

// EventStreamMaxLen caps EventStream.
const EventStreamMaxLen = 100000

// EgressReportKey holds a machine's latest egress readiness report.
func EgressReportKey(machineID string) string { return prefix + "egress-report:" + machineID }

// EgressReportTTL is how long an egress report is kept after the heartbeat
// that carried it.
const EgressReportTTL = 10 * time.Minute

// PresenceKey says which replica holds a machine's tunnel.
func PresenceKey(machineID string) string { return prefix + "presence:" + machineID }

// ReplicaChannel carries calls forwarded to one replica, and their answers.
func ReplicaChannel(replica string) string { return prefix + "replica:" + replica }

// QueueKey is a pool's queue of pending tasks: a sorted set of
// "workspace/task" members scored by submit time in milliseconds.
func QueueKey(pool string) string { return prefix + "queue:" + pool }

// SchedulerLockKey is held by the replica scheduling a pool.
func SchedulerLockKey(pool string) string { return prefix + "sched:lock:" + pool }

// SchedulerLockTTL bounds a scheduling pass's hold on its pool's lock.
const SchedulerLockTTL = 10 * time.Second

// SchedulerWakeChannel carries the ID of a replica that asks every other
// one for a scheduling pass.
const SchedulerWakeChannel = prefix + "sched"

// TaskEventsKey is a task's event stream; entry IDs are follow cursors.
func TaskEventsKey(taskID string) string { return prefix + "task:" + taskID + ":events" }

// TaskAcksKey holds, per attempt, the last agent record stored.
func TaskAcksKey(taskID string) string { return prefix + "task:" + taskID + ":acks" }

// TaskEventsChannel carries the ID of a task whose stream grew.
const TaskEventsChannel = prefix + "task-events"

// TaskEventsMaxLen bounds one task's stream; older entries are trimmed.
const TaskEventsMaxLen = 200000

// TaskEventsKeep is how long a finished task's events stay followable.
const TaskEventsKeep = 7 * 24 * time.Hour

// KubePoolLockKey is held by the replica reconciling a Kubernetes pool's
// worker Jobs, so two replicas never create a Job for the same waiting work.
func KubePoolLockKey(pool string) string { return prefix + "kubepool:lock:" + pool }

// KubePoolStatusKey holds "WORKERS|STATUS" of a Kubernetes pool for
// `pool list`, refreshed by every reconcile.
func KubePoolStatusKey(pool string) string { return prefix + "kubepool:status:" + pool }

// KubePoolStatusTTL is how long a status outlives its last reconcile.
const KubePoolStatusTTL = 30 * time.Second
