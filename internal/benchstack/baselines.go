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
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	start := time.Now()
	sub, err := s.tasks.SubmitTask(ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Image: image, Command: []string{"echo", "hi"}}})
	if err != nil {
		return 0, 0, fmt.Errorf("submit: %w", err)
	}
	st, err := s.tasks.FollowTask(ctx, &v1.FollowTaskRequest{Id: sub.Task.Id})
	if err != nil {
		return 0, 0, fmt.Errorf("follow task %s: %w", sub.Task.Id, err)
	}
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, 0, fmt.Errorf("follow task %s: %w", sub.Task.Id, err)
		}
		if ev.GetLog() != nil && first == 0 {
			first = time.Since(start)
		}
		if sc := ev.GetState(); sc != nil && sc.TaskState == v1.TaskState_TASK_STATE_FAILED {
			return 0, 0, fmt.Errorf("task %s failed: %s", sub.Task.Id, sc.Message)
		}
	}
	end = time.Since(start)
	if first == 0 {
		return 0, 0, fmt.Errorf("task %s printed nothing", sub.Task.Id)
	}
	return first, end, nil
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
