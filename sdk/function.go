package sdk

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// Memory sizes for the Memory option.
const (
	KiB uint64 = 1 << 10
	MiB uint64 = 1 << 20
	GiB uint64 = 1 << 30
)

// DefaultMaxOutput bounds Result.Stdout and Result.Stderr (each).
const DefaultMaxOutput = 1 << 20

// securityEnv are the environment variables that tighten a task's security
// (see the package doc); they pass from this process to its tasks.
var securityEnv = []string{"LEVERS9_SECURITY_PROFILE", "LEVERS9_SECCOMP"}

// Function is a command to run remotely, configured once and called many
// times. It is safe for concurrent use.
type Function struct {
	c    *Client
	name string
	spec *v1.TaskSpec
	// maxOutput bounds each of Result's Stdout and Stderr.
	maxOutput int
	// problems are the option errors, reported by every call.
	problems []string
}

// FunctionOption configures a Function.
type FunctionOption func(*Function)

// Image runs the task in this image (empty: the controlplane's
// worker.defaultImage; a reference without a registry resolves against
// worker.imageRegistry).
func Image(ref string) FunctionOption { return func(f *Function) { f.spec.Image = ref } }

// Command is the command to run (the image's entrypoint stays in front);
// Remote's arguments are appended to it.
func Command(argv ...string) FunctionOption {
	return func(f *Function) { f.spec.Command = append([]string(nil), argv...) }
}

// GPU asks for n whole GPUs (never shared), of the named type when gpuType
// is not empty.
func GPU(n int, gpuType string) FunctionOption {
	return func(f *Function) {
		if n < 0 || n > math.MaxInt32 {
			f.problems = append(f.problems, fmt.Sprintf("GPU: %d GPUs is not a count", n))
			return
		}
		f.spec.Gpus, f.spec.GpuType = int32(n), gpuType
	}
}

// Pool runs the task on a machine of this pool (default "default").
func Pool(name string) FunctionOption { return func(f *Function) { f.spec.Pool = name } }

// Secret names a workspace secret (levers9 secret put NAME) whose keys
// become environment variables of the task, each with its value. Only the
// name travels with the task; the controlplane opens the value when it
// starts an attempt, and refuses the submit when the workspace has no
// such secret or a key is also set by Env or another Secret. Repeatable;
// naming a secret twice names it once.
func Secret(name string) FunctionOption {
	return func(f *Function) {
		if !slices.Contains(f.spec.Secrets, name) {
			f.spec.Secrets = append(f.spec.Secrets, name)
		}
	}
}

// Volume mounts a workspace volume (levers9 volume create NAME) at path in
// the task's container, read-write. Only the reference travels with the
// task; the controlplane refuses the submit when the workspace has no such
// volume or path is over /proc, /sys, /dev, /etc or "/". Mounting a second
// volume at the same path replaces the first.
func Volume(name, path string) FunctionOption { return volume(name, path, false) }

// ReadOnlyVolume is Volume mounted read-only: writes fail with EROFS.
func ReadOnlyVolume(name, path string) FunctionOption { return volume(name, path, true) }

func volume(name, path string, ro bool) FunctionOption {
	return func(f *Function) {
		f.spec.Volumes = slices.DeleteFunc(f.spec.Volumes, func(v *v1.VolumeRef) bool { return v.GetPath() == path })
		f.spec.Volumes = append(f.spec.Volumes, &v1.VolumeRef{Name: name, Path: path, ReadOnly: ro})
	}
}

// Env sets an environment variable of the task.
func Env(key, value string) FunctionOption {
	return func(f *Function) {
		if f.spec.Env == nil {
			f.spec.Env = map[string]string{}
		}
		f.spec.Env[key] = value
	}
}

// MaxInputBytes is the most input a task may be given (the controlplane
// refuses more).
const MaxInputBytes = 1 << 20

// Input hands b to the task as the read-only file /run/levers9/io/input
// (at most MaxInputBytes). The task may write its answer to
// /run/levers9/io/result; Client.TaskResult returns it once the task
// ended. Every attempt gets the same input.
func Input(b []byte) FunctionOption {
	return func(f *Function) {
		if len(b) > MaxInputBytes {
			f.problems = append(f.problems, fmt.Sprintf("Input: %d bytes, more than %d", len(b), MaxInputBytes))
			return
		}
		f.spec.Input = bytes.Clone(b)
	}
}

// DefaultRetries is how many new attempts a Function's task gets when the
// machine running it is lost, unless Retries says otherwise: a reclaimed
// spot node should not fail a call.
const DefaultRetries = 2

// Retries is how many new attempts the task gets when the machine running
// it is lost (default DefaultRetries; 0: none). A non-zero exit is a
// result and is never retried.
func Retries(n int) FunctionOption {
	return func(f *Function) {
		if n < 0 || n > math.MaxInt32 {
			f.problems = append(f.problems, fmt.Sprintf("Retries: %d is not a count", n))
			return
		}
		f.spec.Retries = int32(n)
	}
}

// Timeout limits the run time of each attempt (zero: none).
func Timeout(d time.Duration) FunctionOption {
	return func(f *Function) {
		if d < 0 {
			f.problems = append(f.problems, fmt.Sprintf("Timeout: %s is negative", d))
			return
		}
		f.spec.Timeout = nil
		if d > 0 {
			f.spec.Timeout = durationpb.New(d)
		}
	}
}

// CPU reserves this many cores (0.5 is half a core; default 0.5), to the
// thousandth.
func CPU(cores float64) FunctionOption {
	return func(f *Function) {
		m := math.Round(cores * 1000)
		if math.IsNaN(cores) || m < 1 || m > math.MaxInt32 {
			f.problems = append(f.problems, fmt.Sprintf("CPU: %v cores is not between 0.001 and %d", cores, math.MaxInt32/1000))
			return
		}
		f.spec.CpuMillis = int64(m)
	}
}

// Memory reserves (and limits the task to) this many bytes; default 256 MiB.
func Memory(bytes uint64) FunctionOption {
	return func(f *Function) {
		if bytes > 0 && bytes < MiB {
			f.problems = append(f.problems, fmt.Sprintf("Memory: %d bytes is less than 1 MiB", bytes))
			return
		}
		f.spec.MemoryBytes = bytes
	}
}

// MaxOutput bounds Result.Stdout and Result.Stderr to their last n bytes
// each (default DefaultMaxOutput); the rest is counted as truncated.
func MaxOutput(n int) FunctionOption {
	return func(f *Function) {
		if n <= 0 {
			f.problems = append(f.problems, fmt.Sprintf("MaxOutput: %d is not positive", n))
			return
		}
		f.maxOutput = n
	}
}

// Function describes a remote command. name labels its tasks' idempotency
// keys and its errors. Option errors are reported by each call.
func (c *Client) Function(name string, opts ...FunctionOption) *Function {
	f := &Function{c: c, name: name, spec: &v1.TaskSpec{Retries: DefaultRetries}, maxOutput: DefaultMaxOutput}
	for _, opt := range opts {
		opt(f)
	}
	// The caller's environment may tighten security for every task it
	// runs; an explicit Env wins.
	for _, k := range securityEnv {
		if v := c.getenv(k); v != "" {
			if _, set := f.spec.Env[k]; !set {
				if f.spec.Env == nil {
					f.spec.Env = map[string]string{}
				}
				f.spec.Env[k] = v
			}
		}
	}
	return f
}

var (
	envKey     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	secretName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
)

// Spec returns the task spec a call with args submits, or every problem
// with it at once.
func (f *Function) Spec(args ...string) (*v1.TaskSpec, error) {
	problems := append([]string(nil), f.problems...)
	spec := proto.Clone(f.spec).(*v1.TaskSpec)
	spec.Env = maps.Clone(f.spec.Env)
	spec.Command = append(spec.Command, args...)
	for k := range spec.Env {
		if !envKey.MatchString(k) {
			problems = append(problems, fmt.Sprintf("Env: %q is not a variable name (letters, digits and _, not starting with a digit)", k))
		}
	}
	if spec.GpuType != "" && spec.Gpus == 0 {
		problems = append(problems, fmt.Sprintf("GPU: type %q without a GPU count", spec.GpuType))
	}
	for _, n := range spec.Secrets {
		if !secretName.MatchString(n) {
			problems = append(problems, fmt.Sprintf("Secret: %q is not a secret name (1-63 letters, digits, '.', '_' or '-', starting with a letter or digit)", n))
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("function %s: %s", f.name, strings.Join(problems, "; "))
	}
	return spec, nil
}

// Submit queues the task (command + args) and returns at once. Its
// idempotency key is made once per call, so a submit the client retries
// after a lost reply never creates a second task.
func (f *Function) Submit(ctx context.Context, args ...string) (*v1.Task, error) {
	spec, err := f.Spec(args...)
	if err != nil {
		return nil, err
	}
	return f.c.Submit(ctx, spec, NewIdempotencyKey(f.name))
}

// Submit queues spec with an idempotency key (empty: none), retrying while
// the controlplane is unreachable; with a key, the retries cannot run the
// task twice.
func (c *Client) Submit(ctx context.Context, spec *v1.TaskSpec, key string) (*v1.Task, error) {
	var resp *v1.SubmitTaskResponse
	call := func(ctx context.Context) (err error) {
		resp, err = c.tasks.SubmitTask(ctx, &v1.SubmitTaskRequest{Spec: spec, IdempotencyKey: key})
		return err
	}
	var err error
	if key != "" {
		err = c.unary(ctx, "submit task", call)
	} else {
		// Without a key a retry could run the task twice: one try only.
		cctx, cancel := context.WithTimeout(c.authed(ctx), c.callTimeout)
		err = call(cctx)
		cancel()
		if err != nil {
			err = c.apiErr("submit task", err)
		}
	}
	if err != nil {
		return nil, err
	}
	return resp.Task, nil
}

// NewIdempotencyKey makes a fresh key labelled with name (as much of it as
// fits in the 128 characters a key may have).
func NewIdempotencyKey(name string) string {
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	label := strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || envKey.MatchString(string(r))) {
			return r
		}
		return '-'
	}, name)
	if len(label) > 80 {
		label = label[:80]
	}
	return "sdk-" + label + "-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// Remote runs the command with args appended and returns once the task has
// finished: it submits once (see Submit), follows the task across dropped
// connections, controlplane restarts and new attempts, and gathers its
// output. A task that did not succeed returns its Result and a *TaskError
// saying why (exit code, cancelled, timed out, lost with no retries left).
// Cancelling ctx cancels the task, and the error wraps ctx's.
func (f *Function) Remote(ctx context.Context, args ...string) (*Result, error) {
	spec, err := f.Spec(args...)
	if err != nil {
		return nil, err
	}
	key := NewIdempotencyKey(f.name)
	task, err := f.c.Submit(ctx, spec, key)
	if err != nil {
		if ctx.Err() == nil {
			return nil, err
		}
		// ctx ended with the submit's reply in flight: the task may exist
		// and run with nobody waiting for it. The same key finds it (or
		// makes it, already unwanted) so it can be cancelled.
		task = f.c.submitDetached(ctx, spec, key)
		if task == nil {
			return nil, err
		}
		r := &Result{TaskID: task.GetId(), State: task.GetState()}
		if t := f.c.cancelDetached(ctx, task.GetId()); t != nil {
			r.State, r.Attempts = t.GetState(), len(t.GetAttempts())
		}
		return r, fmt.Errorf("function %s: task %s cancelled: %w", f.name, task.GetId(), ctx.Err())
	}
	res, err := f.c.wait(ctx, task.GetId(), f.maxOutput)
	if ctx.Err() == nil && err != nil && res == nil {
		// Following failed for good (the controlplane stayed away): the
		// caller sees an error and may call again, so do not leave this
		// task running too.
		f.c.cancelDetached(ctx, task.GetId())
		return &Result{TaskID: task.GetId(), State: task.GetState()}, fmt.Errorf("function %s: %w (task %s cancelled)", f.name, err, task.GetId())
	}
	if ctx.Err() != nil {
		r := &Result{TaskID: task.GetId(), State: task.GetState()}
		if res != nil {
			r = res
		}
		if t := f.c.cancelDetached(ctx, task.GetId()); t != nil {
			r.State, r.Attempts = t.GetState(), len(t.GetAttempts())
		}
		return r, fmt.Errorf("function %s: task %s cancelled: %w", f.name, task.GetId(), ctx.Err())
	}
	if err != nil {
		var te *TaskError
		if errors.As(err, &te) {
			te.Function = f.name
		}
	}
	return res, err
}

// cancelDetached cancels a task after ctx ended, with a short deadline of
// its own; best effort.
func (c *Client) cancelDetached(ctx context.Context, id string) *v1.Task {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	t, err := c.Cancel(cctx, id)
	if err != nil {
		return nil
	}
	return t
}

// submitDetached repeats a submit after ctx ended, with a short deadline
// of its own; best effort.
func (c *Client) submitDetached(ctx context.Context, spec *v1.TaskSpec, key string) *v1.Task {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	t, err := c.Submit(cctx, spec, key)
	if err != nil {
		return nil
	}
	return t
}

// Wait follows a task to its end and returns its Result (output bounded to
// DefaultMaxOutput per stream) and, when it did not succeed, a *TaskError.
// Unlike Remote it does not cancel the task when ctx ends.
func (c *Client) Wait(ctx context.Context, taskID string) (*Result, error) {
	return c.wait(ctx, taskID, DefaultMaxOutput)
}

func (c *Client) wait(ctx context.Context, taskID string, maxOutput int) (*Result, error) {
	stdout, stderr := newTail(maxOutput), newTail(maxOutput)
	var dropped uint64
	err := c.Follow(ctx, taskID, "", func(ev *TaskEvent) error {
		if l := ev.GetLog(); l != nil {
			dropped += l.GetDroppedBefore()
			if l.GetStream() == v1.LogStream_LOG_STREAM_STDERR {
				stderr.add(l.GetText())
			} else {
				stdout.add(l.GetText())
			}
		}
		return nil
	})
	partial := &Result{TaskID: taskID, Stdout: stdout.String(), Stderr: stderr.String(),
		StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated, DroppedLines: dropped}
	if err != nil {
		if ctx.Err() != nil {
			return partial, err
		}
		return nil, err
	}
	// The task record is the authority on the end: exit code, message,
	// attempts.
	t, err := c.Task(ctx, taskID)
	if err != nil {
		return partial, err
	}
	res := partial
	res.State, res.Message, res.Attempts = t.GetState(), t.GetMessage(), len(t.GetAttempts())
	if n := len(t.GetAttempts()); n > 0 {
		res.Reason, res.Summary = t.GetAttempts()[n-1].GetReason(), t.GetAttempts()[n-1].GetSummary()
	}
	if t.ExitCode != nil {
		code := int(t.GetExitCode())
		res.ExitCode = &code
	}
	return res, ErrorOf(t)
}
