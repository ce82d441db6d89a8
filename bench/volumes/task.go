package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image/build"
)

// bundle is a busybox root and the agent's hardened spec for it (the
// default pool's profile, seccomp enforced), as bench/tasks' bare bundle:
// each phase rewrites config.json with its own command and binds, then
// runs it with `runc run`. Phases run one at a time.
type bundle struct {
	dir    string // holds config.json and rootfs
	rootfs string
	root   string // runc --root
	prefix string // of container IDs and cgroup paths: l9vb-<pid>
	host   sandbox.Host
	sec    sandbox.Security
	seq    int
}

func newBundle(ctx context.Context, dir string) (*bundle, error) {
	b := &bundle{dir: dir, rootfs: filepath.Join(dir, "rootfs"), root: filepath.Join(dir, "runc-root"),
		prefix: fmt.Sprintf("l9vb-%d", os.Getpid())}
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "etc", "vol", "local"} {
		if err := os.MkdirAll(filepath.Join(b.rootfs, d), 0o755); err != nil {
			return nil, err
		}
	}
	bb, err := os.ReadFile(build.DefaultBusybox)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(b.rootfs, "bin/busybox"), bb, 0o755); err != nil {
		return nil, err
	}
	for _, applet := range []string{"sh", "dd", "cat", "mkdir", "true"} {
		if err := os.Symlink("busybox", filepath.Join(b.rootfs, "bin", applet)); err != nil {
			return nil, err
		}
	}
	// The mount point of the random source file bound at /src.
	if err := os.WriteFile(filepath.Join(b.rootfs, "src"), nil, 0o644); err != nil {
		return nil, err
	}
	if b.host, err = sandbox.DetectHost(ctx, sandbox.NVIDIADiscovery{}); err != nil {
		return nil, err
	}
	b.sec = sandbox.Security{Profile: sandbox.ProfileHardened, Seccomp: sandbox.SeccompEnforce, DropNetRaw: true}.WithDefaults()
	return b, nil
}

// phase is one task. Its script runs setup, prints "ready", waits for a
// line on stdin, runs work and prints "done"; the host times from the line
// it sends to the "done" it reads, so runc's own start and stop are not in
// the figure. before runs on the host between "ready" and the line.
type phase struct {
	name   string
	mounts []sandbox.Mount
	setup  string
	work   string
	before func() error
}

// run runs p in a fresh container and returns the time of its work and
// what the task wrote to stderr. The container is gone when it returns,
// also on error or when ctx ends.
func (b *bundle) run(ctx context.Context, p phase) (time.Duration, string, error) {
	script := "set -e\n" + p.setup + "\necho ready\nread -r _\n" + p.work + "\necho done\n"
	id, err := b.write(p.mounts, "/bin/sh", "-c", script)
	if err != nil {
		return 0, "", err
	}
	defer b.delete(id)
	cmd := exec.Command("runc", "--root", b.root, "run", "--bundle", b.dir, id)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, "", err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return 0, "", err
	}
	// Killing the container closes its end of the pipes, so the reads
	// below return when ctx ends.
	stop := context.AfterFunc(ctx, func() { b.delete(id) })
	defer stop()
	lines := bufio.NewScanner(stdout)
	next := func(want string) error {
		if !lines.Scan() {
			return fmt.Errorf("the task ended before printing %q", want)
		}
		if got := lines.Text(); got != want {
			return fmt.Errorf("the task printed %q, want %q", got, want)
		}
		return nil
	}
	var took time.Duration
	err = next("ready")
	if err == nil && p.before != nil {
		err = p.before()
	}
	if err == nil {
		start := time.Now()
		if _, err = stdin.Write([]byte("\n")); err == nil {
			if err = next("done"); err == nil {
				took = time.Since(start)
			}
		}
	}
	stdin.Close()
	if err != nil {
		b.delete(id)
	}
	werr := cmd.Wait()
	if err == nil {
		err = werr
	}
	if cerr := ctx.Err(); cerr != nil {
		err = cerr
	}
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%w: %s", err, msg)
		}
		return 0, "", fmt.Errorf("%s: %w", p.name, err)
	}
	return took, stderr.String(), nil
}

// empty returns the median wall time of n `runc run`s of the bundle with
// the given binds running true: runc's own cost, outside the figures.
func (b *bundle) empty(ctx context.Context, mounts []sandbox.Mount, n int) (time.Duration, error) {
	var ds []time.Duration
	for range n {
		id, err := b.write(mounts, "/bin/true")
		if err != nil {
			return 0, err
		}
		start := time.Now()
		out, err := exec.CommandContext(ctx, "runc", "--root", b.root, "run", "--bundle", b.dir, id).CombinedOutput()
		ds = append(ds, time.Since(start))
		b.delete(id)
		if err != nil {
			return 0, fmt.Errorf("empty runc run: %w: %s", err, out)
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], nil
}

// write writes config.json for a new container running args with the
// binds, as the agent's volume hook hands them to the sandbox (agent
// mounts; the sandbox forces nosuid,nodev), and returns its ID.
func (b *bundle) write(mounts []sandbox.Mount, args ...string) (string, error) {
	b.seq++
	id := fmt.Sprintf("%s-%d", b.prefix, b.seq)
	spec, _, err := sandbox.BuildSpec(sandbox.TaskSpec{ID: id, Rootfs: b.rootfs, Args: args, AgentMounts: mounts}, b.sec, b.host)
	if err != nil {
		return "", err
	}
	spec.Linux.CgroupsPath = "/" + id
	data, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	return id, os.WriteFile(filepath.Join(b.dir, "config.json"), data, 0o600)
}

// delete kills and removes container id if it is still there; a foreground
// `runc run` that ended has already removed it, so errors are ignored.
func (b *bundle) delete(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = exec.CommandContext(ctx, "runc", "--root", b.root, "delete", "-f", id).Run()
}

// cleanup removes cgroups of the bundle's containers that runc left
// behind (it removes them itself when a container ends normally) and
// returns the ones it could not.
func (b *bundle) cleanup() error {
	var errs []error
	for _, pattern := range []string{"/sys/fs/cgroup/" + b.prefix + "-*", "/sys/fs/cgroup/*/" + b.prefix + "-*"} {
		dirs, _ := filepath.Glob(pattern)
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("cgroup left behind: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
