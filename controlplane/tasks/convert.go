package tasks

import (
	"fmt"
	"sort"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/store"
)

// The one mapping between the store's states and the API's enums; a test
// checks that it covers both sides exactly.
var (
	taskStatesPB = map[store.TaskState]v1.TaskState{
		store.TaskPending: v1.TaskState_TASK_STATE_PENDING, store.TaskScheduled: v1.TaskState_TASK_STATE_SCHEDULED,
		store.TaskRunning: v1.TaskState_TASK_STATE_RUNNING, store.TaskSucceeded: v1.TaskState_TASK_STATE_SUCCEEDED,
		store.TaskFailed: v1.TaskState_TASK_STATE_FAILED, store.TaskCancelled: v1.TaskState_TASK_STATE_CANCELLED,
		store.TaskTimedOut: v1.TaskState_TASK_STATE_TIMED_OUT,
	}
	attemptStatesPB = map[store.AttemptState]v1.AttemptState{
		store.AttemptScheduled: v1.AttemptState_ATTEMPT_STATE_SCHEDULED, store.AttemptRunning: v1.AttemptState_ATTEMPT_STATE_RUNNING,
		store.AttemptSucceeded: v1.AttemptState_ATTEMPT_STATE_SUCCEEDED, store.AttemptFailed: v1.AttemptState_ATTEMPT_STATE_FAILED,
		store.AttemptCancelled: v1.AttemptState_ATTEMPT_STATE_CANCELLED, store.AttemptTimedOut: v1.AttemptState_ATTEMPT_STATE_TIMED_OUT,
		store.AttemptLost: v1.AttemptState_ATTEMPT_STATE_LOST,
	}
	reasonsPB = map[store.Reason]v1.FailureReason{
		store.ReasonNone: v1.FailureReason_FAILURE_REASON_UNSPECIFIED, store.ReasonStartFailed: v1.FailureReason_FAILURE_REASON_START_FAILED,
		store.ReasonImageNotFound: v1.FailureReason_FAILURE_REASON_IMAGE_NOT_FOUND, store.ReasonImagePullFailed: v1.FailureReason_FAILURE_REASON_IMAGE_PULL_FAILED,
		store.ReasonMountFailed: v1.FailureReason_FAILURE_REASON_MOUNT_FAILED, store.ReasonNetworkFailed: v1.FailureReason_FAILURE_REASON_NETWORK_FAILED,
		store.ReasonOutOfMemory: v1.FailureReason_FAILURE_REASON_OUT_OF_MEMORY, store.ReasonPidsLimit: v1.FailureReason_FAILURE_REASON_PIDS_LIMIT,
	}
)

// reasonPB is a failure reason as the API spells it.
func reasonPB(r store.Reason) v1.FailureReason { return reasonsPB[r] }

// reasonOf is the store's spelling of an API failure reason.
func reasonOf(r v1.FailureReason) (store.Reason, bool) {
	for k, v := range reasonsPB {
		if v == r {
			return k, true
		}
	}
	return "", false
}

// taskStatePB is a task state as the API spells it (UNSPECIFIED for a
// value the store never holds).
func taskStatePB(s store.TaskState) v1.TaskState { return taskStatesPB[s] }

// taskStateOf is the store's spelling of an API task state.
func taskStateOf(s v1.TaskState) (store.TaskState, bool) {
	for k, v := range taskStatesPB {
		if v == s {
			return k, true
		}
	}
	return "", false
}

// attemptStatePB is an attempt state as the API spells it.
func attemptStatePB(s store.AttemptState) v1.AttemptState { return attemptStatesPB[s] }

// attemptStateOf is the store's spelling of an API attempt state.
func attemptStateOf(s v1.AttemptState) (store.AttemptState, bool) {
	for k, v := range attemptStatesPB {
		if v == s {
			return k, true
		}
	}
	return "", false
}

// terminal reports whether an API task state is never left.
func terminal(s v1.TaskState) bool {
	st, ok := taskStateOf(s)
	return ok && st.Terminal()
}

func tsp(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

// exitCodePB is an exit code as the API carries it: absent when none.
func exitCodePB(p *int) *int32 {
	if p == nil {
		return nil
	}
	c := int32(*p)
	return &c
}

// taskPB is a task with its attempts as the API shows it.
func taskPB(t store.Task, atts []store.Attempt) *v1.Task {
	spec := &v1.TaskSpec{}
	_ = protojson.Unmarshal(t.Spec, spec) // written by Submit
	spec.Input = nil                      // kept apart from the spec, never shown
	pb := &v1.Task{Id: t.ID, Spec: spec, State: taskStatePB(t.State), CreatedAt: timestamppb.New(t.CreatedAt), FinishedAt: tsp(t.FinishedAt),
		ExitCode: exitCodePB(t.ExitCode), Message: t.Message, IdempotencyKey: t.IdempotencyKey}
	for _, a := range atts {
		pb.Attempts = append(pb.Attempts, &v1.Attempt{Number: int32(a.Number), State: attemptStatePB(a.State), MachineId: a.MachineID,
			ScheduledAt: timestamppb.New(a.ScheduledAt), StartedAt: tsp(a.StartedAt), FinishedAt: tsp(a.FinishedAt),
			ExitCode: exitCodePB(a.ExitCode), Message: a.Message, DroppedLines: uint64(a.DroppedLines), ImageDigest: a.ImageDigest,
			Reason: reasonPB(a.Reason), Summary: a.Summary, AppliedSecurity: appliedPB(a.AppliedSecurity)})
	}
	pb.MountFindings = mountFindingsPB(t.MountFindings)
	return pb
}

func mountFindingsPB(fs []store.MountFinding) []*v1.MountFinding {
	var out []*v1.MountFinding
	for _, f := range fs {
		out = append(out, &v1.MountFinding{Volume: f.Volume, Path: f.Path, Reason: f.Reason})
	}
	return out
}

// attemptFor is the attempt as the agent runs it.
func attemptFor(c *config.Config, t store.Task, a store.Attempt) (*agentv1.TaskAttempt, error) {
	spec := &v1.TaskSpec{}
	if err := protojson.Unmarshal(t.Spec, spec); err != nil {
		return nil, fmt.Errorf("decode the spec of task %s: %w", t.ID, err)
	}
	return &agentv1.TaskAttempt{TaskId: t.ID, Attempt: int32(a.Number), Pool: t.Pool, Image: spec.Image, Command: spec.Command, Env: envList(spec.Env),
		User: spec.User, Cwd: spec.Cwd, CpuMillis: a.CPUMillis, MemoryBytes: uint64(a.MemoryBytes), GpuDevices: a.GPUDevices,
		Timeout: spec.Timeout, Security: SecuritySettings(c, t.Pool), ImageRegistry: c.Worker.ImageRegistry}, nil
}

// envList is a spec's environment as sorted K=V entries.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// WorkerWideSecurity is the security the workers of an attached cluster
// apply: worker.containerSecurity without the pool's overrides (the
// pool's runtime stays, since it is not a security key).
func WorkerWideSecurity(c *config.Config, pool string) *v1.SecuritySettings {
	sec := c.Worker.ContainerSecurity
	return &v1.SecuritySettings{Profile: sec.Profile, Seccomp: sec.Seccomp, DropNetRaw: *sec.DropNetRaw,
		BridgePortIsolation: *sec.BridgePortIsolation, EgressMode: sec.Egress.Mode, EgressAllow: sec.Egress.Allow,
		Runtime: c.Worker.Pools[pool].Runtime, VolumeMountValidation: c.Worker.VolumeMountValidation,
		ApparmorProfile: sec.ApparmorProfile}
}

// SecuritySettings is a pool's effective security as the API shows it and
// agents apply it.
func SecuritySettings(c *config.Config, pool string) *v1.SecuritySettings {
	sec := c.Worker.EffectiveSecurity(pool)
	return &v1.SecuritySettings{Profile: sec.Profile, Seccomp: sec.Seccomp, DropNetRaw: *sec.DropNetRaw,
		BridgePortIsolation: *sec.BridgePortIsolation, EgressMode: sec.Egress.Mode, EgressAllow: sec.Egress.Allow,
		Runtime: c.Worker.Pools[pool].Runtime, VolumeMountValidation: c.Worker.EffectiveMountValidation(pool),
		ApparmorProfile: sec.ApparmorProfile}
}
