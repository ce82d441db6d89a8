// Package tasks owns the controlplane's side of running tasks: submitting
// (with idempotency keys), the per-pool queues in Redis, the scheduler that
// places tasks on machines with room and pushes them down their tunnels,
// the records agents report back (state changes and output lines, stored
// once each), the event stream a caller follows from a cursor, and giving
// up attempts whose machine is lost (a new attempt when retries remain).
//
// Postgres (store) is the truth for tasks and attempts; Redis holds the
// queues and each task's event stream. Several replicas may run a Manager
// against the same Postgres and Redis: a placement is one transaction that
// locks the machine row and moves the task out of PENDING only once, so a
// task is never placed twice and a machine never overbooked, whichever
// replica places it.
//
// It knows the tunnel only through the Agents interface (push a call to a
// machine, tell whether it is connected) and never imports the API layer.
package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
	"github.com/levers9/levers9/sandbox"
)

// Agents is what the manager needs of the tunnel registry.
type Agents interface {
	// Conn pushes calls to a machine's agent, wherever its tunnel is held.
	Conn(ctx context.Context, machineID string) (grpc.ClientConnInterface, error)
	// Online reports whether a machine holds a tunnel to any replica.
	Online(machineID string) (transport string, ok bool)
}

// Config configures a Manager.
type Config struct {
	Store  *store.Store
	Redis  *redis.Client
	Config *config.Config
	// Agents returns the registry, or nil while it is not started yet.
	Agents func() Agents
	Log    *slog.Logger
	// Tick is how often the scheduler and the lost-agent check run without
	// being woken (default 1 s).
	Tick time.Duration
	Now  func() time.Time
}

// Defaults of a task's resources.
const (
	DefaultCPUMillis   = 500
	DefaultMemoryBytes = 256 << 20
	maxRetries         = 10
	maxGPUs            = 64
	maxKeyLen          = 128
)

// Manager runs tasks. Start/Stop follow the start-stop contract.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	replica string

	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
	wake   chan struct{}
	// offlineSince and served belong to the loop goroutine.
	offlineSince map[string]time.Time
	served       map[string]time.Time

	wmu      sync.Mutex
	watchers map[string]map[chan struct{}]bool // task ID -> followers here
}

// New checks cfg.
func New(cfg Config) (*Manager, error) {
	if cfg.Store == nil || cfg.Redis == nil || cfg.Config == nil || cfg.Agents == nil {
		return nil, errors.New("tasks: Store, Redis, Config and Agents are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Tick == 0 {
		cfg.Tick = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Manager{cfg: cfg, log: cfg.Log, replica: ids.Random(8), wake: make(chan struct{}, 1), offlineSince: map[string]time.Time{}, served: map[string]time.Time{},
		watchers: map[string]map[chan struct{}]bool{}}, nil
}

func (m *Manager) now() time.Time { return m.cfg.Now() }

// Start runs the scheduler and the lost-agent check until Stop.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		return errors.New("tasks: already started")
	}
	ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	m.wg.Add(2)
	go m.listen(ctx)
	go m.loop(ctx)
	return nil
}

// Stop ends the loops and waits for them.
func (m *Manager) Stop() {
	m.mu.Lock()
	cancel := m.cancel
	m.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	m.wg.Wait()
}

// Submit validates spec, stores the task and queues it. With an idempotency
// key used before in the workspace it returns that task (existing=true).
func (m *Manager) Submit(ctx context.Context, workspaceID string, spec *v1.TaskSpec, key string) (*v1.Task, bool, error) {
	spec, err := m.resolve(ctx, spec, key)
	if err != nil {
		return nil, false, err
	}
	specJSON, err := protojson.Marshal(spec)
	if err != nil {
		return nil, false, fmt.Errorf("encode task spec: %w", err)
	}
	row, existing, err := m.cfg.Store.InsertTask(ctx, store.Task{ID: ids.New("t"), WorkspaceID: workspaceID, Pool: spec.Pool, Spec: specJSON,
		CPUMillis: spec.CpuMillis, MemoryBytes: int64(spec.MemoryBytes), GPUs: int(spec.Gpus), GPUType: spec.GpuType,
		Retries: int(spec.Retries), IdempotencyKey: key, CreatedAt: m.now()})
	if err != nil {
		return nil, false, err
	}
	if !existing {
		m.publish(ctx, row.ID, &v1.TaskEvent{Event: &v1.TaskEvent_State{State: &v1.StateChange{
			TaskState: v1.TaskState_TASK_STATE_PENDING, Message: "queued in pool " + row.Pool}}})
		if err := m.enqueue(ctx, store.PendingTask{ID: row.ID, WorkspaceID: workspaceID, Pool: row.Pool, CreatedAt: row.CreatedAt}); err != nil {
			// The rescuer puts it back from Postgres; the task is not lost.
			m.log.Warn("task not queued in Redis yet", "task_id", row.ID, "err", err)
		}
		m.Wake()
	}
	t, atts, err := m.cfg.Store.GetTask(ctx, workspaceID, row.ID)
	if err != nil {
		return nil, false, err
	}
	return taskPB(t, atts), existing, nil
}

var (
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	keyRE    = regexp.MustCompile(`^[\x21-\x7e]+$`)
)

// resolve checks a spec and fills its defaults; every problem is named.
func (m *Manager) resolve(ctx context.Context, in *v1.TaskSpec, key string) (*v1.TaskSpec, error) {
	spec := proto.Clone(in).(*v1.TaskSpec)
	if spec == nil {
		spec = &v1.TaskSpec{}
	}
	w := &m.cfg.Config.Worker
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(key) > maxKeyLen || (key != "" && !keyRE.MatchString(key)) {
		bad("idempotency_key: use up to %d printable characters without spaces", maxKeyLen)
	}
	if spec.Pool == "" {
		spec.Pool = "default"
	}
	if _, ok := w.Pools[spec.Pool]; !ok {
		names := make([]string, 0, len(w.Pools))
		for n := range w.Pools {
			names = append(names, n)
		}
		sort.Strings(names)
		bad("pool %q is not declared (worker.pools has %s)", spec.Pool, strings.Join(names, ", "))
	}
	if spec.Image == "" {
		spec.Image = w.DefaultImage
		if spec.Image == "" {
			bad("image: none given and the controlplane has no worker.defaultImage")
		}
	}
	if strings.ContainsAny(spec.Image, " \t\n") {
		bad("image %q: a reference has no spaces", spec.Image)
	}
	size := 0
	for k, v := range spec.Env {
		if !envKeyRE.MatchString(k) {
			bad("env %q: not a variable name (letters, digits, '_', not starting with a digit)", k)
		}
		size += len(k) + len(v)
	}
	for _, a := range spec.Command {
		size += len(a)
	}
	if size > 256<<10 {
		bad("command and env: %d bytes, more than 256 KiB", size)
	}
	switch {
	case spec.CpuMillis == 0:
		spec.CpuMillis = DefaultCPUMillis
	case spec.CpuMillis < 0 || spec.CpuMillis > 1_000_000:
		bad("cpu_millis: %d is not in 1..1000000", spec.CpuMillis)
	}
	switch {
	case spec.MemoryBytes == 0:
		spec.MemoryBytes = DefaultMemoryBytes
	case spec.MemoryBytes < 4<<20:
		bad("memory_bytes: %d is less than 4 MiB", spec.MemoryBytes)
	}
	if spec.Gpus < 0 || spec.Gpus > maxGPUs {
		bad("gpus: %d is not in 0..%d", spec.Gpus, maxGPUs)
	}
	if spec.GetTimeout() != nil && (spec.GetTimeout().CheckValid() != nil || spec.GetTimeout().AsDuration() < 0) {
		bad("timeout: %v is not a duration of zero or more", spec.GetTimeout())
	}
	if spec.Retries < 0 || spec.Retries > maxRetries {
		bad("retries: %d is not in 0..%d", spec.Retries, maxRetries)
	}
	if spec.Cwd != "" && !strings.HasPrefix(spec.Cwd, "/") {
		bad("cwd %q: not an absolute path", spec.Cwd)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("task spec: %w: %w", errdefs.ErrInvalidArgument, errors.Join(errs...))
	}
	if err := m.checkSecurity(spec); err != nil {
		return nil, err
	}
	return spec, m.checkFits(ctx, spec)
}

// checkSecurity refuses a task env that asks for looser security than its
// pool (the agent applies the tighter one).
func (m *Manager) checkSecurity(spec *v1.TaskSpec) error {
	sec := m.cfg.Config.Worker.EffectiveSecurity(spec.Pool)
	var env []string
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	if _, err := sandbox.Tighten(sandbox.Security{Profile: sandbox.Profile(sec.Profile), Seccomp: sandbox.SeccompMode(sec.Seccomp)}, env); err != nil {
		return fmt.Errorf("task security in pool %s: %w", spec.Pool, err)
	}
	return nil
}

// checkFits refuses a task no machine of its pool could ever hold, so a
// caller hears it now instead of waiting forever. An empty pool accepts
// CPU tasks (machines may join); GPU tasks need a pool that has GPUs.
func (m *Manager) checkFits(ctx context.Context, spec *v1.TaskSpec) error {
	machines, err := m.cfg.Store.PoolMachines(ctx, spec.Pool)
	if err != nil {
		return err
	}
	pool := m.cfg.Config.Worker.Pools[spec.Pool]
	var most int
	var fitsCPU, fitsAll bool
	known := 0
	for _, pm := range machines {
		c := capacityOf(pm)
		if c.cpu == 0 {
			continue // no inventory yet: its size is unknown
		}
		known++
		most = max(most, len(c.gpus))
		if c.cpu >= spec.CpuMillis && c.mem >= int64(spec.MemoryBytes) {
			fitsCPU = true
			if len(c.matchingGPUs(spec.GpuType)) >= int(spec.Gpus) {
				fitsAll = true
			}
		}
	}
	if spec.Gpus > 0 {
		switch {
		case most == 0 && pool.GPUType == "" && known == len(machines):
			return fmt.Errorf("pool %q has no GPUs (none of its %d machines reports one, and it declares no gpuType); choose a GPU pool (levers9 pool list): %w",
				spec.Pool, len(machines), errdefs.ErrFailedPrecondition)
		case known > 0 && most < int(spec.Gpus):
			return fmt.Errorf("pool %q: the largest machine has %d GPUs, the task asks for %d: %w", spec.Pool, most, spec.Gpus, errdefs.ErrFailedPrecondition)
		}
	}
	if known > 0 && !fitsAll && (spec.Gpus == 0 || most >= int(spec.Gpus)) {
		what := "CPU and memory"
		if fitsCPU {
			what = fmt.Sprintf("%d GPUs of type %q", spec.Gpus, spec.GpuType)
		}
		return fmt.Errorf("pool %q: no machine has %s for this task (%d mCPU, %d bytes): %w", spec.Pool, what, spec.CpuMillis, spec.MemoryBytes, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Get returns a task of the workspace.
func (m *Manager) Get(ctx context.Context, workspaceID, id string) (*v1.Task, error) {
	t, atts, err := m.cfg.Store.GetTask(ctx, workspaceID, id)
	if err != nil {
		return nil, err
	}
	return taskPB(t, atts), nil
}

// List returns a page of the workspace's tasks, newest first.
func (m *Manager) List(ctx context.Context, workspaceID string, states []v1.TaskState, size int, token string) ([]*v1.Task, string, error) {
	if size == 0 {
		size = 50
	}
	if size < 1 || size > 500 {
		return nil, "", fmt.Errorf("page_size %d is not in 1..500: %w", size, errdefs.ErrInvalidArgument)
	}
	var beforeAt time.Time
	var beforeID string
	if token != "" {
		at, id, ok := strings.Cut(token, "_t_")
		ns, err := parseInt(at)
		if !ok || err != nil {
			return nil, "", fmt.Errorf("page_token is not one this API returned: %w", errdefs.ErrInvalidArgument)
		}
		beforeAt, beforeID = time.Unix(0, ns), "t_"+id
	}
	var names []string
	for _, s := range states {
		name, ok := stateName(s)
		if !ok {
			return nil, "", fmt.Errorf("states: %v is not a task state: %w", s, errdefs.ErrInvalidArgument)
		}
		names = append(names, name)
	}
	rows, atts, err := m.cfg.Store.ListTasks(ctx, workspaceID, names, size, beforeAt, beforeID)
	if err != nil {
		return nil, "", err
	}
	out := make([]*v1.Task, len(rows))
	for i, r := range rows {
		out[i] = taskPB(r, atts[r.ID])
	}
	next := ""
	if len(rows) == size {
		last := rows[len(rows)-1]
		next = fmt.Sprintf("%d_%s", last.CreatedAt.UnixNano(), last.ID)
	}
	return out, next, nil
}

func parseInt(s string) (int64, error) {
	var n int64
	_, err := fmt.Sscanf(s, "%d", &n)
	return n, err
}

// Cancel stops a task: a pending one at once, a placed one through its
// agent (or as lost, if its machine is gone).
func (m *Manager) Cancel(ctx context.Context, workspaceID, id string) (*v1.Task, error) {
	t, err := m.cfg.Store.RequestCancel(ctx, workspaceID, id)
	if err != nil {
		return nil, err
	}
	switch t.State {
	case store.TaskCancelled:
		if t.Attempts == 0 || t.FinishedAt != nil {
			m.dequeue(ctx, t.Pool, t.WorkspaceID, t.ID)
			m.publish(ctx, t.ID, &v1.TaskEvent{Attempt: int32(t.Attempts), Event: &v1.TaskEvent_State{State: &v1.StateChange{
				TaskState: v1.TaskState_TASK_STATE_CANCELLED, Message: t.Message}}})
		}
	case store.TaskScheduled, store.TaskRunning:
		_, atts, err := m.cfg.Store.GetTask(ctx, workspaceID, id)
		if err == nil && len(atts) > 0 {
			a := atts[len(atts)-1]
			m.goPush(func(ctx context.Context) error {
				conn, err := m.agents(ctx, a.MachineID)
				if err != nil {
					return err
				}
				_, err = agentv1.NewAgentClient(conn).CancelTask(ctx, &agentv1.CancelTaskRequest{TaskId: a.TaskID, Attempt: int32(a.Number), Reason: "cancelled by the user"})
				return err
			}, "cancel", a.TaskID, a.MachineID)
		}
	}
	return m.Get(ctx, workspaceID, id)
}

func (m *Manager) agents(ctx context.Context, machineID string) (grpc.ClientConnInterface, error) {
	ag := m.cfg.Agents()
	if ag == nil {
		return nil, fmt.Errorf("the tunnel registry is not started yet: %w", errdefs.ErrUnavailable)
	}
	return ag.Conn(ctx, machineID)
}

// goPush runs one call to an agent in the background with its own bound.
func (m *Manager) goPush(call func(context.Context) error, what, taskID, machineID string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := call(ctx); err != nil {
			m.log.Warn("push to agent failed", "call", what, "task_id", taskID, "machine_id", machineID, "err", err)
		}
	}()
}

// attemptFor is the attempt as the agent runs it.
func (m *Manager) attemptFor(t store.Task, a store.Attempt) (*agentv1.TaskAttempt, error) {
	spec := &v1.TaskSpec{}
	if err := protojson.Unmarshal(t.Spec, spec); err != nil {
		return nil, fmt.Errorf("decode the spec of task %s: %w", t.ID, err)
	}
	env := make([]string, 0, len(spec.Env))
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return &agentv1.TaskAttempt{TaskId: t.ID, Attempt: int32(a.Number), Pool: t.Pool, Image: spec.Image, Command: spec.Command, Env: env,
		User: spec.User, Cwd: spec.Cwd, CpuMillis: a.CPUMillis, MemoryBytes: uint64(a.MemoryBytes), GpuDevices: a.GPUDevices,
		Timeout: spec.Timeout, Security: SecuritySettings(m.cfg.Config, t.Pool), ImageRegistry: m.cfg.Config.Worker.ImageRegistry}, nil
}

// SecuritySettings is a pool's effective security as the API shows it and
// agents apply it.
func SecuritySettings(c *config.Config, pool string) *v1.SecuritySettings {
	sec := c.Worker.EffectiveSecurity(pool)
	return &v1.SecuritySettings{Profile: sec.Profile, Seccomp: sec.Seccomp, DropNetRaw: *sec.DropNetRaw,
		BridgePortIsolation: *sec.BridgePortIsolation, EgressMode: sec.Egress.Mode, EgressAllow: sec.Egress.Allow,
		Runtime: c.Worker.Pools[pool].Runtime}
}

var stateNames = map[v1.TaskState]string{
	v1.TaskState_TASK_STATE_PENDING: store.TaskPending, v1.TaskState_TASK_STATE_SCHEDULED: store.TaskScheduled,
	v1.TaskState_TASK_STATE_RUNNING: store.TaskRunning, v1.TaskState_TASK_STATE_SUCCEEDED: store.TaskSucceeded,
	v1.TaskState_TASK_STATE_FAILED: store.TaskFailed, v1.TaskState_TASK_STATE_CANCELLED: store.TaskCancelled,
	v1.TaskState_TASK_STATE_TIMED_OUT: store.TaskTimedOut,
}

func stateName(s v1.TaskState) (string, bool) { n, ok := stateNames[s]; return n, ok }

func taskState(name string) v1.TaskState {
	for s, n := range stateNames {
		if n == name {
			return s
		}
	}
	return v1.TaskState_TASK_STATE_UNSPECIFIED
}

func attemptState(name string) v1.AttemptState {
	if name == store.AttemptLost {
		return v1.AttemptState_ATTEMPT_STATE_LOST
	}
	if v, ok := v1.AttemptState_value["ATTEMPT_STATE_"+name]; ok {
		return v1.AttemptState(v)
	}
	return v1.AttemptState_ATTEMPT_STATE_UNSPECIFIED
}

func tsp(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

func deref(p *int) int32 {
	if p == nil {
		return 0
	}
	return int32(*p)
}

func taskPB(t store.Task, atts []store.Attempt) *v1.Task {
	spec := &v1.TaskSpec{}
	_ = protojson.Unmarshal(t.Spec, spec) // written by Submit
	pb := &v1.Task{Id: t.ID, Spec: spec, State: taskState(t.State), CreatedAt: timestamppb.New(t.CreatedAt), FinishedAt: tsp(t.FinishedAt),
		ExitCode: deref(t.ExitCode), Message: t.Message, IdempotencyKey: t.IdempotencyKey}
	for _, a := range atts {
		pb.Attempts = append(pb.Attempts, &v1.Attempt{Number: int32(a.Number), State: attemptState(a.State), MachineId: a.MachineID,
			ScheduledAt: timestamppb.New(a.ScheduledAt), StartedAt: tsp(a.StartedAt), FinishedAt: tsp(a.FinishedAt),
			ExitCode: deref(a.ExitCode), Message: a.Message, DroppedLines: uint64(a.DroppedLines), ImageDigest: a.ImageDigest})
	}
	return pb
}
