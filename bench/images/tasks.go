package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image/build"
)

// firstLine submits `echo hi` on image (to the default pool) and returns
// the time until its first output line reached a follower, and until the
// follower saw the task end.
func (s *stack) firstLine(image string) (first, end time.Duration, err error) {
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

// bareBundle writes a busybox bundle with the spec the agent's sandbox
// would give a task of the default pool (hardened, its seccomp profile),
// as bench/tasks does, and returns a runner timing `runc run` of the
// recipe's run step command in it, to its exit.
func (s *stack) bareBundle(ctx context.Context) (func(round int, nonce string) (time.Duration, error), error) {
	bundle := filepath.Join(s.work, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
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
	host, err := sandbox.DetectHost(ctx, sandbox.NVIDIADiscovery{})
	if err != nil {
		return nil, fmt.Errorf("detect host: %w", err)
	}
	sec := sandbox.Security{Profile: sandbox.ProfileHardened, Seccomp: sandbox.SeccompEnforce, DropNetRaw: true}
	root := filepath.Join(s.work, "runc-root")
	return func(round int, nonce string) (time.Duration, error) {
		args := []string{"/bin/sh", "-c", fmt.Sprintf("echo %s > /built.txt && echo %s", nonce, ranLine)}
		spec, _, err := sandbox.BuildSpec(sandbox.TaskSpec{ID: "bare", Rootfs: rootfs, Args: args}, sec.WithDefaults(), host)
		if err != nil {
			return 0, fmt.Errorf("spec: %w", err)
		}
		spec.Linux.CgroupsPath = "/l9ib-bare"
		b, err := json.Marshal(spec)
		if err != nil {
			return 0, err
		}
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
			return 0, err
		}
		cmd := exec.Command("runc", "--root", root, "run", "--bundle", bundle, fmt.Sprintf("l9ib-bare-%d", round))
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err = cmd.Run()
		d := time.Since(start)
		if err != nil {
			return 0, fmt.Errorf("runc run: %w: %s", err, out.String())
		}
		if !strings.Contains(out.String(), ranLine) {
			return 0, fmt.Errorf("runc run printed %q, not %q", out.String(), ranLine)
		}
		return d, nil
	}, nil
}

// med is the median (the mean of the middle two for an even count).
func med(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func minOf(d []time.Duration) time.Duration { return slices.Min(d) }
func maxOf(d []time.Duration) time.Duration { return slices.Max(d) }

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}
