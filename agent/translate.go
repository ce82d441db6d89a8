package agent

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/google/go-containerregistry/pkg/name"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/levers9/levers9/agent/taskrun"
	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/volumes"
)

// taskFromAttempt turns the controlplane's attempt into the Runner's task,
// reporting every bad field at once. defaultPool names the pool when the
// attempt does not.
func taskFromAttempt(a *agentv1.TaskAttempt, defaultPool string) (taskrun.Task, error) {
	var errs []error
	if a == nil {
		return taskrun.Task{}, fmt.Errorf("attempt: missing: %w", errdefs.ErrInvalidArgument)
	}
	t := taskrun.Task{
		ID: a.TaskId, Attempt: int(a.Attempt), Pool: a.Pool, Image: a.Image,
		Args: a.Command, Env: a.Env, SecretEnv: a.SecretEnv, User: a.User, Cwd: a.Cwd,
		GPUs: len(a.GpuDevices), GPUDevices: a.GpuDevices, Input: a.GetInput(),
	}
	if t.Pool == "" {
		t.Pool = defaultPool
	}
	for _, v := range a.GetVolumes() {
		t.Volumes = append(t.Volumes, taskrun.Volume{
			Volume:        volumes.Volume{ID: v.GetVolumeId(), Workspace: v.GetWorkspaceId(), Name: v.GetName(), QuotaBytes: v.GetQuotaBytes()},
			TaskWorkspace: v.GetTaskWorkspaceId(), Driver: v.GetDriver(), Path: v.GetPath(), ReadOnly: v.GetReadOnly(),
			FilerAddr: v.GetFilerAddr(), FilerURL: v.GetFilerUrl(), Env: v.GetEnv(),
		})
	}
	if a.CpuMillis < 0 {
		errs = append(errs, fmt.Errorf("attempt.cpu_millis: %d is negative", a.CpuMillis))
	}
	if a.MemoryBytes > math.MaxInt64 {
		errs = append(errs, fmt.Errorf("attempt.memory_bytes: %d is too large", a.MemoryBytes))
	}
	t.Resources = sandbox.Resources{CPUMillis: a.CpuMillis, MemoryBytes: int64(min(a.MemoryBytes, math.MaxInt64))}
	if a.Timeout != nil {
		if err := a.Timeout.CheckValid(); err != nil {
			errs = append(errs, fmt.Errorf("attempt.timeout: %w", err))
		} else {
			t.Timeout = a.Timeout.AsDuration()
		}
	}
	if a.ImageRegistry != "" && strings.TrimSpace(a.Image) != "" {
		ref, err := qualifyImage(a.Image, a.ImageRegistry)
		if err != nil {
			errs = append(errs, err)
		} else {
			t.Image = ref
		}
	}
	if ra := a.GetRegistryAuth(); ra != nil {
		// Keyed by the host the controlplane resolved; the image store asks
		// for the host the reference resolves to, so a mismatch is anonymous.
		t.RegistryAuth = image.StaticKeychain{ra.GetHost(): {Username: ra.GetUsername(), Password: ra.GetPassword()}}
	}
	if s := a.Security; s != nil {
		t.Security = sandbox.Security{Profile: sandbox.Profile(s.Profile), Seccomp: sandbox.SeccompMode(s.Seccomp),
			DropNetRaw: s.DropNetRaw, Runtime: sandbox.RuntimeName(s.Runtime),
			MountValidation: sandbox.MountValidation(s.VolumeMountValidation), AppArmorProfile: s.ApparmorProfile}
		// An empty egress mode keeps the node's network settings.
		if s.EgressMode != "" {
			t.Network = &egress.SecurityConfig{BridgePortIsolation: s.BridgePortIsolation,
				Egress: egress.EgressConfig{Mode: egress.Mode(s.EgressMode), Allow: s.EgressAllow}}
		}
	}
	t.Security = t.Security.WithDefaults()
	if err := t.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return t, fmt.Errorf("run task %s attempt %d: %w: %w", a.TaskId, a.Attempt, errdefs.ErrInvalidArgument, errors.Join(errs...))
	}
	return t, nil
}

// qualifyImage puts registry in front of a reference that names none.
func qualifyImage(ref, registry string) (string, error) {
	r, err := name.ParseReference(ref, name.WithDefaultRegistry(registry))
	if err != nil {
		return "", fmt.Errorf("attempt.image: %q: %w", ref, err)
	}
	return r.Name(), nil
}

// stateOf maps the Runner's terminal states to the API's.
func stateOf(s taskrun.State) v1.AttemptState {
	switch s {
	case taskrun.StateRunning:
		return v1.AttemptState_ATTEMPT_STATE_RUNNING
	case taskrun.StateSucceeded:
		return v1.AttemptState_ATTEMPT_STATE_SUCCEEDED
	case taskrun.StateFailed:
		return v1.AttemptState_ATTEMPT_STATE_FAILED
	case taskrun.StateCancelled:
		return v1.AttemptState_ATTEMPT_STATE_CANCELLED
	case taskrun.StateTimedOut:
		return v1.AttemptState_ATTEMPT_STATE_TIMED_OUT
	}
	return v1.AttemptState_ATTEMPT_STATE_UNSPECIFIED
}

// logRecord turns an output line into a record; invalid UTF-8 is replaced
// (protobuf strings must be UTF-8).
func logRecord(l taskrun.LogLine) *agentv1.AttemptRecord {
	stream := v1.LogStream_LOG_STREAM_STDOUT
	if l.Stream == taskrun.Stderr {
		stream = v1.LogStream_LOG_STREAM_STDERR
	}
	text := l.Text
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	return &agentv1.AttemptRecord{Time: timestamppb.New(l.Time),
		Record: &agentv1.AttemptRecord_Log{Log: &v1.LogLine{Stream: stream, Text: text, DroppedBefore: l.DroppedBefore}}}
}
