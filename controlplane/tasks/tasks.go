// Package tasks owns the controlplane's side of running tasks. It is split
// the way a job system is (river's shape), into services with their own
// loops and their own Start/Stop, wired by Service:
//
//	Submitter  submit.go, validate.go: validation, idempotency keys, the
//	           first queueing; cancel (and the push that stops a placed
//	           attempt); reads (get, list).
//	Scheduler  scheduler.go, capacity.go, queue.go: per-pool placement on
//	           machines with room, fair across workspaces, one replica per
//	           pool at a time (a Redis lock); pushes placed attempts down
//	           their machine's tunnel, with the task's secrets opened for
//	           that push only (secrets.go; Submit checks their names).
//	Rescuer    rescuer.go: attempts whose machine is lost (deleted, or its
//	           tunnel gone longer than controlplane.lostAgentGrace) become
//	           LOST and their task a new attempt when retries remain;
//	           pending tasks Redis lost go back into their queue.
//	Events     events.go: each task's event stream (state changes and
//	           output lines), appended once per record, followed from a
//	           cursor, with one Redis subscription per replica waking the
//	           followers here.
//	Workers    kubepool.go: the worker Jobs of pools with provider
//	           kubernetes, made on demand for waiting work and removed
//	           when finished; a worker pod deleted or evicted loses its
//	           attempts at once. Attached clusters (attached.go) get
//	           theirs through their cluster agent (workerjobs.go).
//	intake     intake.go: what agents report (records, the attempts they
//	           hold), stored once each and handed to the services above.
//
// Postgres (store) is the truth for tasks and attempts, and the states and
// their legal moves are store.TaskState and store.AttemptState; Redis holds
// the queues, the scheduler lock and each task's event stream, under the
// keys of controlplane/bus. Several replicas may run a Service against the
// same Postgres and Redis: a placement is one transaction that locks the
// machine row and moves the task out of PENDING only once, so a task is
// never placed twice and a machine never overbooked, whichever replica
// places it.
//
// It knows the tunnel only through the Agents interface (push a call to a
// machine, tell whether it is connected) and never imports the API layer;
// it maps its states to the API's enums in convert.go and nowhere else.
// API: internal to the controlplane.
package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// Agents is what the services need of the tunnel registry.
type Agents interface {
	// Conn pushes calls to a machine's agent, wherever its tunnel is held.
	Conn(ctx context.Context, machineID string) (grpc.ClientConnInterface, error)
	// Online reports whether a machine holds a tunnel to any replica.
	Online(machineID string) (transport string, ok bool)
}

// Config configures a Service.
type Config struct {
	Store  *store.Store
	Redis  *redis.Client
	Config *config.Config
	// Agents returns the registry, or nil while it is not started yet.
	Agents func() Agents
	Log    *slog.Logger
	// RegistryLogins opens a workspace's registry login at push time; nil
	// pushes every attempt without one.
	RegistryLogins RegistryLogins
	// Tick is how often the scheduler and the rescuer run without being
	// woken (default 1 s).
	Tick  time.Duration
	Clock clock.Clock
	// Secrets opens the workspace secrets tasks name (secrets.go); nil
	// fails every push of a task that names one.
	Secrets SecretOpener
	// Kube gives the worker Job client of pools with provider kubernetes
	// (kubepool.go); nil leaves their tasks waiting.
	Kube KubeClients
	// VolumeMountEnv is what a node needs to mount a seaweedfs volume
	// (seaweed.MountCredentials as KEY=VALUE), pushed with each attempt
	// that mounts one; never logged.
	VolumeMountEnv []string
	// WorkerJoin is what worker pods join with, read when a Job is made
	// (the public endpoints are known only once the server listens).
	WorkerJoin func() WorkerJoin
}

// deps is what every service of the package shares; read-only after New.
type deps struct {
	store   *store.Store
	redis   *redis.Client
	config  *config.Config
	agentsF func() Agents
	logins  RegistryLogins
	log     *slog.Logger
	clock   clock.Clock
	tick    time.Duration
	secrets SecretOpener
	// volumeMountEnv is Config.VolumeMountEnv.
	volumeMountEnv []string
	// placed is what this replica knows of where attempts run.
	placed *placedAttempts
}

func (d *deps) now() time.Time { return d.clock.Now() }

// agents is the registry, or an Unavailable error before it started.
func (d *deps) agents() (Agents, error) {
	if ag := d.agentsF(); ag != nil {
		return ag, nil
	}
	return nil, fmt.Errorf("the tunnel registry is not started yet: %w", errdefs.ErrUnavailable)
}

// conn is a connection that pushes calls to a machine's agent.
func (d *deps) conn(ctx context.Context, machineID string) (agentv1.AgentClient, error) {
	ag, err := d.agents()
	if err != nil {
		return nil, err
	}
	c, err := ag.Conn(ctx, machineID)
	if err != nil {
		return nil, err
	}
	return agentv1.NewAgentClient(c), nil
}

// Service is the task side of one controlplane replica: the services
// below, wired to each other. Start/Stop follow the start-stop contract:
// Start returns once every service runs (and stops those it started if one
// fails); Stop waits for every goroutine any of them started, and is safe
// twice, concurrently, or before Start.
type Service struct {
	Submitter *Submitter
	Scheduler *Scheduler
	Rescuer   *Rescuer
	Events    *Events
	Workers   *Workers
	intake    *intake
}

// New checks cfg and wires the services; nothing runs until Start.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Redis == nil || cfg.Config == nil || cfg.Agents == nil {
		return nil, errors.New("tasks: Store, Redis, Config and Agents are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Tick == 0 {
		cfg.Tick = time.Second
	}
	d := &deps{store: cfg.Store, redis: cfg.Redis, config: cfg.Config, agentsF: cfg.Agents, logins: cfg.RegistryLogins, log: cfg.Log,
		clock: clock.OrReal(cfg.Clock), tick: cfg.Tick, secrets: cfg.Secrets,
		volumeMountEnv: cfg.VolumeMountEnv, placed: newPlacedAttempts()}
	q := &queue{d: d}
	ev := newEvents(d)
	sch := newScheduler(d, q, ev)
	resc := newRescuer(d, q, ev, sch.Wake)
	sch.lose = resc.Lose
	return &Service{
		Submitter: newSubmitter(d, q, ev, sch.Wake),
		Scheduler: sch,
		Rescuer:   resc,
		Events:    ev,
		Workers:   &Workers{d: d, rescuer: resc, kube: cfg.Kube, join: cfg.WorkerJoin, life: lifecycle{name: "kubernetes workers"}},
		intake:    &intake{d: d, events: ev, rescuer: resc, wake: sch.Wake},
	}, nil
}

// starter is one service's half of the start-stop contract.
type starter interface {
	Start(ctx context.Context) error
	Stop()
}

func (s *Service) order() []starter {
	return []starter{s.Events, s.Submitter, s.Scheduler, s.Rescuer, s.Workers}
}

// Start runs every service until Stop.
func (s *Service) Start(ctx context.Context) error {
	var started []starter
	for _, sv := range s.order() {
		if err := sv.Start(ctx); err != nil {
			for i := len(started) - 1; i >= 0; i-- {
				started[i].Stop()
			}
			return err
		}
		started = append(started, sv)
	}
	return nil
}

// Stop stops the services in the reverse order of Start and waits for
// them.
func (s *Service) Stop() {
	o := s.order()
	for i := len(o) - 1; i >= 0; i-- {
		o[i].Stop()
	}
}

// Submit validates spec, stores the task and queues it (see Submitter).
func (s *Service) Submit(ctx context.Context, workspaceID string, spec *v1.TaskSpec, key string) (*v1.Task, bool, error) {
	return s.Submitter.Submit(ctx, workspaceID, spec, key)
}

// Get returns a task of the workspace.
func (s *Service) Get(ctx context.Context, workspaceID, id string) (*v1.Task, error) {
	return s.Submitter.Get(ctx, workspaceID, id)
}

// List returns a page of the workspace's tasks, newest first.
func (s *Service) List(ctx context.Context, workspaceID string, states []v1.TaskState, size int, token string) ([]*v1.Task, string, error) {
	return s.Submitter.List(ctx, workspaceID, states, size, token)
}

// Cancel stops a task (see Submitter.Cancel).
func (s *Service) Cancel(ctx context.Context, workspaceID, id string) (*v1.Task, error) {
	return s.Submitter.Cancel(ctx, workspaceID, id)
}

// Follow sends a task's events (see Events.Follow).
func (s *Service) Follow(ctx context.Context, workspaceID, taskID, cursor string, noWait bool, send func(*v1.TaskEvent) error) error {
	return s.Events.Follow(ctx, workspaceID, taskID, cursor, noWait, send)
}

// Report stores an attempt's records from the machine running it.
func (s *Service) Report(ctx context.Context, machineID string, req *agentv1.ReportAttemptRequest) (*agentv1.ReportAttemptResponse, error) {
	return s.intake.Report(ctx, machineID, req)
}

// Running reconciles the attempts an agent holds and returns those it must
// stop.
func (s *Service) Running(ctx context.Context, machineID string, running []*agentv1.RunningAttempt) ([]*agentv1.RunningAttempt, error) {
	return s.intake.Running(ctx, machineID, running)
}

// lifecycle is the start-stop contract each service embeds: Start once at
// a time, goroutines counted so Stop waits for every one, Stop safe twice
// or before Start, and Start again after Stop.
type lifecycle struct {
	name string
	// mu guards ctx and cancel; a goroutine is only added under it while
	// ctx is live, so none is added once Stop began waiting.
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// begin marks the service started and returns its run context, which ends
// at Stop (never with the caller's ctx).
func (l *lifecycle) begin(ctx context.Context) (context.Context, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cancel != nil {
		return nil, fmt.Errorf("tasks %s: already started", l.name)
	}
	l.ctx, l.cancel = context.WithCancel(context.WithoutCancel(ctx))
	return l.ctx, nil
}

// goRun runs f in a goroutine Stop waits for, with the run context; it
// reports false (and runs nothing) when the service is not running.
func (l *lifecycle) goRun(f func(ctx context.Context)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil || l.ctx.Err() != nil {
		return false
	}
	ctx := l.ctx
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f(ctx)
	}()
	return true
}

// stop ends the run context and waits for every goroutine.
func (l *lifecycle) stop() {
	l.mu.Lock()
	if l.cancel == nil {
		l.mu.Unlock()
		return
	}
	ctx := l.ctx
	l.cancel()
	l.mu.Unlock()
	l.wg.Wait()
	l.mu.Lock()
	if l.ctx == ctx { // not a later Start's
		l.ctx, l.cancel = nil, nil
	}
	l.mu.Unlock()
}

// stopping reports whether ctx ended because the service is stopping (a
// cancelled context is never a failure to log).
func stopping(ctx context.Context) bool { return ctx.Err() != nil }
