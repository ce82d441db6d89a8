package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// OCI drives runc or runsc as a binary. Each container gets the directory
// StateDir/ID holding its state root ("root/"), the runtime's log, pid
// file, the container's output and its exit status.
//
// The runtime's foreground `run` is the child of a holder (holder.go): a
// tiny shell in its own session (setsid), started ahead, that runs `run` with the container's stdout and
// stderr going to the files "stdout" and "stderr" of the container
// directory, and writes `run`'s exit status to "exit" when it returns. So
// the container is no child of this process and outlives it (a stopped or
// killed agent leaves it running), and a later process learns its output
// by following the files (Reattach, from the offsets it had shipped) and
// its exit status from the file. `runc create` alone would leave the init
// process orphaned and only a subreaper could collect its exit status.
// Create prepares the container directory; Start launches the holder and
// returns once the container has a pid.
type OCI struct {
	name     RuntimeName
	binary   string
	stateDir string
	logger   *slog.Logger

	// mu guards containers and version.
	mu         sync.Mutex
	containers map[string]*ociContainer
	version    string

	// dirs wakes containers' watchers when their files change.
	dirs dirWatch
	// holders keeps a holder started ahead of the next container.
	holders holders
}

var _ Runtime = (*OCI)(nil)

type ociContainer struct {
	dir  string
	opts CreateOpts

	// done is closed once the runtime's `run` has exited and its output
	// was read to the end; exit and waitErr are set before.
	done    chan struct{}
	exit    ExitStatus
	waitErr error
	// started is set by Start and Reattach.
	started bool
	// running is closed by the watcher once the runtime wrote the pid
	// file: the container's process runs.
	running chan struct{}
}

// The files of a container directory the holder writes.
const (
	stdoutFile = "stdout"
	stderrFile = "stderr"
	exitFile   = "exit"
	holderFile = "holder"
	metaFile   = "meta.json"
	// pidFile is the runtime's (--pid-file): written once the container's
	// process runs.
	pidFile = "pid"
)

// meta is what a later process needs to drive a container it did not
// start.
type meta struct {
	Bundle     string `json:"bundle"`
	OwnNetwork bool   `json:"ownNetwork"`
	NetRaw     bool   `json:"netRaw"`
}

// Close ends the holder kept ready for the next container; containers
// already started go on.
func (r *OCI) Close() { r.holders.close() }

// NewOCI returns a Runtime for the binary (looked up on PATH when not
// absolute) keeping container state under stateDir.
func NewOCI(name RuntimeName, binary, stateDir string, logger *slog.Logger) (*OCI, error) {
	if name != RuntimeRunc && name != RuntimeRunsc {
		return nil, fmt.Errorf("runtime %q: %w", name, errdefs.ErrInvalidArgument)
	}
	if binary == "" {
		binary = string(name)
	}
	p, err := exec.LookPath(binary)
	if err != nil {
		return nil, errdefs.WithRetry(fmt.Errorf("runtime %s: %w: %w", name, err, errdefs.ErrFailedPrecondition), false)
	}
	if !filepath.IsAbs(stateDir) {
		return nil, fmt.Errorf("runtime %s: state dir %q is not absolute: %w", name, stateDir, errdefs.ErrInvalidArgument)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &OCI{name: name, binary: p, stateDir: stateDir, logger: logger.With("runtime", string(name)), containers: map[string]*ociContainer{}}, nil
}

// Name implements Runtime.
func (r *OCI) Name() RuntimeName { return r.name }

func (r *OCI) root(dir string) string { return filepath.Join(dir, "root") }

func (r *OCI) globalArgs(dir string, opts CreateOpts) []string {
	args := []string{"--root", r.root(dir), "--log", filepath.Join(dir, "runtime.log")}
	if r.name == RuntimeRunsc {
		// Volumes (bind mounts) are shared with the host and with other
		// machines: the sentry revalidates what it cached of them, so a
		// task sees files another machine changes while it runs ("shared",
		// runsc's default, stated so a changed default cannot cache them
		// for the task's life). No --overlay2: its default wraps only the
		// root, never a bind mount, so a task's writes reach the volume.
		args = append(args, "--oci-seccomp", "--file-access-mounts=shared")
		if opts.OwnNetwork {
			args = append(args, "--network=none")
		}
		if opts.NetRaw {
			args = append(args, "--net-raw")
		}
	} else {
		args = append(args, "--log-format", "json")
	}
	return args
}

// Create implements Runtime.
func (r *OCI) Create(ctx context.Context, id string, opts CreateOpts) error {
	if !taskIDRe.MatchString(id) {
		return errdefs.WithRetry(fmt.Errorf("create container %q: bad id: %w", id, errdefs.ErrInvalidArgument), false)
	}
	if _, err := os.Stat(filepath.Join(opts.Bundle, "config.json")); err != nil {
		return errdefs.WithRetry(fmt.Errorf("create container %s: bundle: %w: %w", id, err, errdefs.ErrInvalidArgument), false)
	}
	dir := filepath.Join(r.stateDir, id)
	if err := os.MkdirAll(r.stateDir, 0o700); err != nil {
		return errdefs.WithRetry(fmt.Errorf("create container %s: %w", id, err), true)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return errdefs.WithRetry(fmt.Errorf("create container %s: %w", id, errdefs.ErrAlreadyExists), false)
		}
		return errdefs.WithRetry(fmt.Errorf("create container %s: %w", id, err), true)
	}
	if err := os.WriteFile(filepath.Join(dir, "runtime"), []byte(r.name), 0o600); err != nil {
		return errdefs.WithRetry(fmt.Errorf("create container %s: %w", id, err), true)
	}
	mb, _ := json.Marshal(meta{Bundle: opts.Bundle, OwnNetwork: opts.OwnNetwork, NetRaw: opts.NetRaw})
	if err := os.WriteFile(filepath.Join(dir, metaFile), mb, 0o600); err != nil {
		return errdefs.WithRetry(fmt.Errorf("create container %s: %w", id, err), true)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.containers[id] = &ociContainer{dir: dir, opts: opts, done: make(chan struct{}), running: make(chan struct{})}
	return nil
}

func (r *OCI) get(id string) (*ociContainer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return nil, errdefs.WithRetry(fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound), false)
	}
	return c, nil
}

// Start implements Runtime.
func (r *OCI) Start(ctx context.Context, id string) error {
	c, err := r.get(id)
	if err != nil {
		return err
	}
	r.mu.Lock()
	if c.started {
		r.mu.Unlock()
		return errdefs.WithRetry(fmt.Errorf("start container %s: already started: %w", id, errdefs.ErrFailedPrecondition), false)
	}
	c.started = true
	r.mu.Unlock()
	args := append(r.globalArgs(c.dir, c.opts), "run")
	if r.name == RuntimeRunc {
		// Keep the stopped container (and its cgroup, whose event counters
		// say whether a limit killed it) until Delete.
		args = append(args, "--keep")
	}
	args = append(args, "--bundle", c.opts.Bundle, "--pid-file", filepath.Join(c.dir, pidFile), id)
	for _, f := range []string{stdoutFile, stderrFile} {
		if err := os.WriteFile(filepath.Join(c.dir, f), nil, 0o600); err != nil {
			err = errdefs.WithRetry(fmt.Errorf("start container %s: %w", id, err), true)
			c.exit, c.waitErr = ExitStatus{Code: -1}, err
			close(c.done)
			return err
		}
	}
	// Not a child tied to ctx: the container outlives the call that starts
	// it, and this process.
	argv := append([]string{r.binary}, args...)
	h, err := r.holders.take()
	if err == nil {
		if err = h.run(c.dir, argv); err != nil && !errors.Is(err, errInvalidHolderArg) {
			// The spare died waiting (killed by hand): one afresh.
			if h, err = spawnHolder(); err == nil {
				err = h.run(c.dir, argv)
			}
		}
	}
	if err != nil {
		err = errdefs.WithRetry(fmt.Errorf("start container %s: holder for %s: %w", id, r.binary, err), !errors.Is(err, errInvalidHolderArg))
		// Waiters must not hang on a runtime that never ran.
		c.exit, c.waitErr = ExitStatus{Code: -1}, err
		close(c.done)
		return err
	}
	cmd := h.cmd
	_ = os.WriteFile(filepath.Join(c.dir, holderFile), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
	holderDone := make(chan struct{})
	go func() {
		// Reap the holder; the exit file says how `run` ended.
		_ = cmd.Wait()
		close(holderDone)
	}()
	go r.watch(id, c, 0, 0, holderDone, cmd.Process.Pid)
	defer r.holders.fill()
	// Wait for the pid file or the runtime's exit, whichever comes first.
	// The watcher looks for the pid file on each of its passes, which the
	// runtime's own writes in the directory wake: a poll here would wake
	// this process every millisecond while the runtime starts on the same
	// CPUs, and slowed it.
	select {
	case <-c.running:
		return nil
	case <-c.done:
		if c.waitErr != nil {
			return c.waitErr
		}
		return nil
	case <-ctx.Done():
		_ = r.Kill(context.WithoutCancel(ctx), id, syscall.SIGKILL)
		return fmt.Errorf("start container %s: %w", id, ctx.Err())
	}
}

// ReattachOpts say where the output of a container started by an earlier
// process goes from now on.
type ReattachOpts struct {
	// Stdout and Stderr receive the output from the given offsets of the
	// container's output files on (what the caller had not shipped yet).
	Stdout, Stderr             io.Writer
	StdoutOffset, StderrOffset int64
}

// Reattach adopts a container an earlier process started (and left running
// or exited): its output files are followed from the offsets into the
// writers, and Wait returns its exit status once the holder recorded it.
// NotFound when there is no such container directory.
func (r *OCI) Reattach(ctx context.Context, id string, opts ReattachOpts) error {
	if !taskIDRe.MatchString(id) {
		return errdefs.WithRetry(fmt.Errorf("reattach container %q: bad id: %w", id, errdefs.ErrInvalidArgument), false)
	}
	dir := filepath.Join(r.stateDir, id)
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.WithRetry(fmt.Errorf("reattach container %s: %w", id, errdefs.ErrNotFound), false)
	}
	if err != nil {
		return errdefs.WithRetry(fmt.Errorf("reattach container %s: %w", id, err), false)
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return errdefs.WithRetry(fmt.Errorf("reattach container %s: %s: %w", id, metaFile, err), false)
	}
	hp, _ := os.ReadFile(filepath.Join(dir, holderFile))
	holder, _ := strconv.Atoi(strings.TrimSpace(string(hp)))
	c := &ociContainer{dir: dir, started: true, done: make(chan struct{}), running: make(chan struct{}),
		opts: CreateOpts{Bundle: m.Bundle, OwnNetwork: m.OwnNetwork, NetRaw: m.NetRaw, Stdout: opts.Stdout, Stderr: opts.Stderr}}
	r.mu.Lock()
	if _, ok := r.containers[id]; ok {
		r.mu.Unlock()
		return errdefs.WithRetry(fmt.Errorf("reattach container %s: %w", id, errdefs.ErrAlreadyExists), false)
	}
	r.containers[id] = c
	r.mu.Unlock()
	go r.watch(id, c, opts.StdoutOffset, opts.StderrOffset, nil, holder)
	return nil
}

// watchEvery is how often the output files are read and the exit file
// looked for.
const watchEvery = 50 * time.Millisecond

// watch follows the container's output files into its writers until the
// holder recorded the exit and the files are read to their end, then
// closes done. holderDone, when not nil, closes when this process reaped
// the holder; otherwise the holder's pid is checked now and then.
func (r *OCI) watch(id string, c *ociContainer, outOff, errOff int64, holderDone <-chan struct{}, holder int) {
	out := &follower{path: filepath.Join(c.dir, stdoutFile), off: outOff, w: c.opts.Stdout}
	errs := &follower{path: filepath.Join(c.dir, stderrFile), off: errOff, w: c.opts.Stderr}
	defer out.close()
	defer errs.close()
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	// Woken by writes in the container's directory (output, the exit
	// file); the tick stays for anything inotify misses.
	wake, stopWake, err := r.dirs.add(c.dir)
	if err == nil {
		defer stopWake()
	} else {
		r.logger.Debug("container output polled only", "container_id", id, "err", err)
	}
	holderGone := false
	running := c.running
	var last time.Time
	for i := 0; ; i++ {
		last = time.Now()
		if running != nil {
			if _, err := os.Stat(filepath.Join(c.dir, pidFile)); err == nil {
				close(running)
				running = nil
			}
		}
		code, ok := readExit(filepath.Join(c.dir, exitFile))
		// Only a pass that found output spaces the next: the first
		// output after a quiet spell (a task's first line) is read at
		// once, even right after the runtime's own writes woke a pass.
		busy := out.read()+errs.read() > 0
		if ok {
			c.exit = exitCode(code)
			if _, err := os.Stat(filepath.Join(c.dir, pidFile)); err != nil {
				// The runtime failed before the container had a process.
				c.waitErr = errdefs.WithRetry(fmt.Errorf("container %s: %s run failed (exit %d): %s", id, r.name, code, r.logTail(c.dir)), false)
			}
			close(c.done)
			return
		}
		if holderGone {
			c.exit = ExitStatus{Code: -1}
			c.waitErr = errdefs.WithRetry(fmt.Errorf("container %s: its holder process ended without recording the exit status", id), false)
			close(c.done)
			return
		}
		select {
		case <-holderDone:
			// One more pass reads the exit file the holder wrote last.
			holderGone, holderDone = true, nil
			continue
		case <-wake:
			if d := minPass - time.Since(last); d > 0 && busy {
				time.Sleep(d)
			}
		case <-tick.C:
		}
		if holderDone == nil && i%40 == 39 && (holder <= 0 || syscall.Kill(holder, 0) == syscall.ESRCH) {
			holderGone = true
		}
	}
}

// readExit reads the holder's exit file; false while it is missing or not
// yet written to its newline.
func readExit(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
		return 0, false
	}
	code, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1, true
	}
	return code, true
}

// exitCode maps a shell's exit status (128+signal for a signal death)
// onto an ExitStatus.
func exitCode(code int) ExitStatus {
	if code > 128 && code < 128+65 {
		return ExitStatus{Code: code, Signal: syscall.Signal(code - 128)}
	}
	return ExitStatus{Code: code}
}

// follower copies what is appended to a file into a writer.
type follower struct {
	path string
	off  int64
	w    io.Writer
	f    *os.File
	buf  []byte
}

// read copies what was appended since the last read and says how much.
func (f *follower) read() int64 {
	if f.f == nil {
		fh, err := os.Open(f.path)
		if err != nil {
			return 0
		}
		f.f, f.buf = fh, make([]byte, 64<<10)
	}
	from := f.off
	for {
		n, err := f.f.ReadAt(f.buf, f.off)
		if n > 0 {
			if f.w != nil {
				_, _ = f.w.Write(f.buf[:n])
			}
			f.off += int64(n)
		}
		if err != nil || n < len(f.buf) {
			return f.off - from
		}
	}
}

func (f *follower) close() {
	if f.f != nil {
		_ = f.f.Close()
	}
}

// logTail returns the last runtime error message, for error texts.
func (r *OCI) logTail(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "runtime.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		var j struct {
			Level, Msg string
		}
		if json.Unmarshal([]byte(l), &j) == nil && j.Msg != "" {
			if j.Level == "error" || j.Level == "fatal" {
				return j.Msg
			}
			continue
		}
		if strings.Contains(strings.ToLower(l), "error") {
			return truncate(l, 500)
		}
	}
	if n := len(lines); n > 0 && lines[n-1] != "" {
		return truncate(lines[n-1], 500)
	}
	return "no runtime error logged"
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Wait implements Runtime.
func (r *OCI) Wait(ctx context.Context, id string) (ExitStatus, error) {
	c, err := r.get(id)
	if err != nil {
		return ExitStatus{}, err
	}
	r.mu.Lock()
	started := c.started
	r.mu.Unlock()
	if !started {
		return ExitStatus{}, errdefs.WithRetry(fmt.Errorf("wait container %s: not started: %w", id, errdefs.ErrFailedPrecondition), false)
	}
	select {
	case <-c.done:
		return c.exit, c.waitErr
	case <-ctx.Done():
		return ExitStatus{}, fmt.Errorf("wait container %s: %w", id, ctx.Err())
	}
}

// Kill implements Runtime. Killing a container that already exited is not
// an error.
func (r *OCI) Kill(ctx context.Context, id string, sig syscall.Signal) error {
	c, err := r.get(id)
	if err != nil {
		return err
	}
	select {
	case <-c.done:
		return nil
	default:
	}
	_, err = r.exec(ctx, c.dir, c.opts, "kill", id, strconv.Itoa(int(sig)))
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kill container %s: %w", id, err)
	}
	return nil
}

// Delete implements Runtime: it kills a running container, waits for the
// runtime to exit (bounded by ctx) and removes the container's directory.
func (r *OCI) Delete(ctx context.Context, id string) error {
	c, err := r.get(id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	r.mu.Lock()
	started := c.started
	r.mu.Unlock()
	if started {
		select {
		case <-c.done:
			if _, err := os.Stat(filepath.Join(c.dir, pidFile)); r.name == RuntimeRunc && err == nil {
				// Run kept the stopped container: remove it and its cgroup.
				if _, err := r.exec(ctx, c.dir, c.opts, "delete", "--force", id); err != nil && !errdefs.IsNotFound(err) {
					return fmt.Errorf("delete container %s: %w", id, err)
				}
			}
		default:
			if _, err := r.exec(ctx, c.dir, c.opts, "delete", "--force", id); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("delete container %s: %w", id, err)
			}
			select {
			case <-c.done:
			case <-ctx.Done():
				return errdefs.WithRetry(fmt.Errorf("delete container %s: runtime did not exit: %w", id, ctx.Err()), true)
			}
		}
	}
	if err := removeContainerDir(c.dir); err != nil {
		return errdefs.WithRetry(fmt.Errorf("delete container %s: %w", id, err), true)
	}
	r.mu.Lock()
	delete(r.containers, id)
	r.mu.Unlock()
	return nil
}

// removeContainerDir removes a container's directory. Recent runsc
// bind-mounts an empty network namespace for its gofer at
// <root>/null-netns and leaves it mounted (possibly several times over);
// unmount those first, or the removal fails with EBUSY.
func removeContainerDir(dir string) error {
	nullNetNS := filepath.Join(dir, "root", "null-netns")
	for syscall.Unmount(nullNetNS, syscall.MNT_DETACH) == nil {
	}
	return os.RemoveAll(dir)
}

// State implements Runtime.
func (r *OCI) State(ctx context.Context, id string) (State, error) {
	c, err := r.get(id)
	if err != nil {
		return State{}, err
	}
	r.mu.Lock()
	started := c.started
	r.mu.Unlock()
	if !started {
		return State{ID: id, Status: StatusCreated}, nil
	}
	select {
	case <-c.done:
		return State{ID: id, Status: StatusStopped}, nil
	default:
	}
	out, err := r.exec(ctx, c.dir, c.opts, "state", id)
	if errdefs.IsNotFound(err) {
		// Between the process exiting and `run` deleting it.
		return State{ID: id, Status: StatusStopped}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("state of container %s: %w", id, err)
	}
	var st State
	if err := json.Unmarshal(out, &st); err != nil {
		return State{}, errdefs.WithRetry(fmt.Errorf("state of container %s: decode %q: %w", id, out, err), false)
	}
	if st.Status != StatusRunning && st.Status != StatusCreated {
		st.Status = StatusStopped
	}
	return st, nil
}

// exec runs one short runtime command and classifies its failure.
func (r *OCI) exec(ctx context.Context, dir string, opts CreateOpts, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.binary, append(r.globalArgs(dir, opts), args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil {
		return out, nil
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%s %s: %w", r.name, args[0], ctx.Err())
	}
	msg := strings.TrimSpace(stderr.String())
	if msg == "" {
		msg = r.logTail(dir)
	}
	return nil, classify(fmt.Errorf("%s %s: %w: %s", r.name, args[0], err, msg), msg)
}

// classify maps runtime messages to error kinds and retryability.
func classify(err error, msg string) error {
	m := strings.ToLower(msg)
	switch {
	case strings.Contains(m, "does not exist") || strings.Contains(m, "not found") || strings.Contains(m, "no such file"):
		return errdefs.WithRetry(fmt.Errorf("%w: %w", err, errdefs.ErrNotFound), false)
	case strings.Contains(m, "already exists"):
		return errdefs.WithRetry(fmt.Errorf("%w: %w", err, errdefs.ErrAlreadyExists), false)
	case strings.Contains(m, "resource temporarily unavailable") || strings.Contains(m, "device or resource busy") || strings.Contains(m, "too many open files"):
		return errdefs.WithRetry(fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable), true)
	default:
		return errdefs.WithRetry(err, false)
	}
}
