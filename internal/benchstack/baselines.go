package benchstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image/build"
)

// FirstLine submits `echo hi` on image (Image when empty) and returns the
// time until its first output line reached a follower, and until the
// follower saw the task end. It gives up after a minute.
func (s *Stack) FirstLine(image string) (first, end time.Duration, err error) {
	tr, err := s.FirstLineTrace(image)
	return tr.First, tr.End, err
}

// Trace is one FirstLine run split at the instants the controlplane
// records: the task stored (created_at), its attempt scheduled
// (scheduled_at) and its container reported running (started_at). All are
// this machine's clock, so the phases add up to First.
type Trace struct {
	First, End time.Duration
	// Phases: submit to stored, stored to scheduled, scheduled to
	// running, running to the first line at the follower.
	Phases [4]time.Duration
	// Agent is the agent's own account of its start, by the phase names
	// of worker_task_start_phase_seconds (AgentPhaseNames); the rest of
	// scheduled→running is the push down the tunnel and taking the
	// attempt (started_at is the agent's instant of RUNNING, so the report
	// back is not in it).
	Agent map[string]time.Duration
}

// AgentPhaseNames orders Trace.Agent as the agent runs them.
var AgentPhaseNames = []string{"image", "volumes", "network", "io", "logs", "prepare", "create", "start"}

// PhaseNames names Trace.Phases in order.
var PhaseNames = [4]string{"submit→stored", "stored→scheduled", "scheduled→running", "running→first line"}

// FirstLineTrace is FirstLine with the phases of the run.
func (s *Stack) FirstLineTrace(image string) (Trace, error) {
	var tr Trace
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	before, err := s.startPhases()
	if err != nil {
		return tr, err
	}
	start := time.Now()
	sub, err := s.tasks.SubmitTask(ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Image: image, Command: []string{"echo", "hi"}}})
	if err != nil {
		return tr, fmt.Errorf("submit: %w", err)
	}
	id := sub.GetTask().GetId()
	st, err := s.tasks.FollowTask(ctx, &v1.FollowTaskRequest{Id: id})
	if err != nil {
		return tr, fmt.Errorf("follow task %s: %w", id, err)
	}
	var firstAt time.Time
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return tr, fmt.Errorf("follow task %s: %w", id, err)
		}
		if ev.GetLog() != nil && firstAt.IsZero() {
			firstAt = time.Now()
		}
		if sc := ev.GetState(); sc != nil && sc.TaskState == v1.TaskState_TASK_STATE_FAILED {
			return tr, fmt.Errorf("task %s failed: %s", id, sc.Message)
		}
	}
	tr.End = time.Since(start)
	if firstAt.IsZero() {
		return tr, fmt.Errorf("task %s printed nothing", id)
	}
	tr.First = firstAt.Sub(start)
	got, err := s.tasks.GetTask(ctx, &v1.GetTaskRequest{Id: id})
	if err != nil {
		return tr, fmt.Errorf("get task %s: %w", id, err)
	}
	t := got.GetTask()
	if len(t.GetAttempts()) == 0 {
		return tr, fmt.Errorf("task %s has no attempt", id)
	}
	a := t.GetAttempts()[0]
	marks := []time.Time{start, t.GetCreatedAt().AsTime(), a.GetScheduledAt().AsTime(), a.GetStartedAt().AsTime(), firstAt}
	for i := range tr.Phases {
		tr.Phases[i] = marks[i+1].Sub(marks[i])
	}
	after, err := s.startPhases()
	if err != nil {
		return tr, err
	}
	tr.Agent = map[string]time.Duration{}
	for name, d := range after {
		tr.Agent[name] = d - before[name]
	}
	return tr, nil
}

// Bundle is an OCI bundle for bare `runc run` baselines: a busybox rootfs
// (sh and echo in /bin) and the spec the agent's sandbox would give a task
// of the default pool (hardened, its seccomp profile), so that what a
// benchmark measures beyond it is levers9's own cost, not hardening's.
type Bundle struct {
	dir, root, name string
	host            sandbox.Host
}

// BareBundle writes the bundle's rootfs under Work.
func (s *Stack) BareBundle(ctx context.Context) (*Bundle, error) {
	b := &Bundle{dir: filepath.Join(s.Work, "bundle"), root: filepath.Join(s.Work, "runc-root"), name: s.opts.Name + "b-bare"}
	rootfs := filepath.Join(b.dir, "rootfs")
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return nil, err
		}
	}
	bb, err := os.ReadFile(build.DefaultBusybox)
	if err != nil {
		return nil, fmt.Errorf("busybox: %w", err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin/busybox"), bb, 0o755); err != nil {
		return nil, err
	}
	for _, applet := range []string{"sh", "echo"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", applet)); err != nil {
			return nil, err
		}
	}
	if b.host, err = sandbox.DetectHost(ctx, sandbox.NVIDIADiscovery{}); err != nil {
		return nil, fmt.Errorf("detect host: %w", err)
	}
	return b, nil
}

// Command writes the bundle's spec for args and returns, not started,
// `runc run` of it as container <Name>b-bare-<round>. Run one at a time:
// each Command rewrites the bundle's one spec.
func (b *Bundle) Command(round int, args ...string) (*exec.Cmd, error) {
	sec := sandbox.Security{Profile: sandbox.ProfileHardened, Seccomp: sandbox.SeccompEnforce, DropNetRaw: true}
	spec, _, err := sandbox.BuildSpec(sandbox.TaskSpec{ID: "bare", Rootfs: filepath.Join(b.dir, "rootfs"), Args: args}, sec.WithDefaults(), b.host)
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	spec.Linux.CgroupsPath = "/" + b.name
	j, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(b.dir, "config.json"), j, 0o600); err != nil {
		return nil, err
	}
	return exec.Command("runc", "--root", b.root, "run", "--bundle", b.dir, fmt.Sprintf("%s-%d", b.name, round)), nil
}
