package tasks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"

	v1 "github.com/levers9/levers9/api/levers9/v1"

	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/ids"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// KubeClients returns the worker Job client of a pool with provider
// kubernetes (its cluster and worker.kubernetes.namespace).
type KubeClients func(pool string) (*kubeworkers.Client, error)

// WorkerJoin is what a worker pod needs to join this controlplane.
type WorkerJoin struct {
	// Controlplane is the gRPC HOST:PORT worker pods dial.
	Controlplane string
	// CAPEM is the controlplane certificate's CA when it is private.
	CAPEM []byte
	// AgentArgs are further `levers9-agent run` flags for worker pods.
	AgentArgs []string
}

// Workers keeps the worker Jobs of pools with provider kubernetes:
//
//   - every tick, one replica per pool (a Redis lock) lists the pool's Jobs,
//     removes finished ones with their Secrets and machines, and creates
//     Jobs for pending work that neither an online worker nor a starting
//     one has room for, packed into the pool's worker shape, never more
//     than maxWorkers in all. A starting Job counts as room, so work
//     waiting on a pod that is Pending (a node group scaling from zero)
//     creates nothing more: the pool says "waiting for nodes".
//   - every replica watches the pools' worker pods: a pod deleted, evicted
//     or failed makes its machine's active attempts LOST at once (their
//     tasks retry on another worker) and retires the machine.
//
// Each Job's agent enrolls as a machine created with it, with a single-use
// join token in a Secret owned by the Job.
//
// The same pass keeps the workers of attached clusters (attached.go): for
// each online cluster agent, through that agent (remoteJobs) instead of a
// client of the controlplane's, for its workspace's tasks only, sized
// into its largest node; its pod-gone reports arrive as WorkerGone.
type Workers struct {
	d       *deps
	rescuer *Rescuer
	kube    KubeClients
	join    func() WorkerJoin
	life    lifecycle
}

func (w *Workers) pools() []string {
	var out []string
	for _, name := range w.d.config.Worker.PoolNames() {
		if w.d.config.Worker.Pools[name].IsKubernetes() {
			out = append(out, name)
		}
	}
	return out
}

// Start runs the reconcile loop and one pod watch per Kubernetes pool
// until Stop; it never waits for a cluster (one that cannot be reached is
// retried and logged). The loop runs even without Kubernetes pools: an
// attached cluster's agent may enroll at any time.
func (w *Workers) Start(ctx context.Context) error {
	pools := w.pools()
	if len(pools) > 0 && (w.kube == nil || w.join == nil) {
		w.d.log.Warn("pools with provider kubernetes but no Kubernetes client: their tasks wait", "pools", pools)
		pools = nil
	}
	if _, err := w.life.begin(ctx); err != nil {
		return err
	}
	for _, pool := range pools {
		pool := pool
		w.life.goRun(func(ctx context.Context) { w.watch(ctx, pool) })
	}
	w.life.goRun(w.loop)
	return nil
}

// Stop ends the loop and the watches and waits for them. Safe twice.
func (w *Workers) Stop() { w.life.stop() }

// watch keeps a pod watch on a pool's workers until ctx ends, starting it
// again after a failure.
func (w *Workers) watch(ctx context.Context, pool string) {
	for backoff := time.Second; ; backoff = min(2*backoff, time.Minute) {
		c, err := w.kube(pool)
		if err == nil {
			wt := c.Watch(pool, func(g kubeworkers.PodGone) { w.podGone(ctx, g) })
			start, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = wt.Start(start)
			cancel()
			if err == nil {
				<-ctx.Done()
				wt.Stop()
				return
			}
			wt.Stop()
		}
		if stopping(ctx) {
			return
		}
		w.d.log.Warn("watching worker pods failed; retrying", "pool", pool, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-w.d.clock.After(backoff):
		}
	}
}

func (w *Workers) loop(ctx context.Context) {
	t := w.d.clock.NewTicker(w.d.tick)
	defer t.Stop()
	for {
		for _, tg := range w.targets(ctx) {
			if err := w.reconcile(ctx, tg); err != nil && !stopping(ctx) {
				w.d.log.Warn("kubernetes pool reconcile failed", "pool", tg.pool, "cluster_agent", tg.agentID, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// target is one set of worker Jobs a reconcile pass keeps: a pool with
// provider kubernetes, or an attached cluster's pool as its agent serves
// it.
type target struct {
	pool string
	cfg  config.Pool
	jobs WorkerJobs
	// shape is the most one worker may take: the pool's declared shape, or
	// an attached cluster's largest node.
	shape      bin
	maxWorkers int
	// agentID is the attached cluster's agent ("" for provider
	// kubernetes); ws the workspace that joined it, the only one its
	// workers serve.
	agentID, ws string
	// keepOnly: another attached cluster of the same pool and workspace
	// makes the new workers (each agent sees only its own starting ones,
	// so two would both make one for the same task); this one only
	// removes what it no longer needs.
	keepOnly bool
}

// attachedMaxWorkers caps the worker Jobs one attached cluster's agent
// keeps at once (the cluster's own quotas and autoscaler bound the rest).
const attachedMaxWorkers = 4

// targets is what this pass reconciles: every Kubernetes pool with a
// client, and every online attached cluster's agent that reported its
// nodes.
func (w *Workers) targets(ctx context.Context) []target {
	var out []target
	if w.kube != nil && w.join != nil {
		for _, pool := range w.pools() {
			c, err := w.kube(pool)
			if err != nil {
				w.d.log.Warn("kubernetes pool has no client", "pool", pool, "err", err)
				continue
			}
			cfg := w.d.config.Worker.Pools[pool]
			out = append(out, target{pool: pool, cfg: cfg, jobs: directJobs{c}, maxWorkers: cfg.MaxWorkers,
				shape: bin{cpu: cfg.Shape.Millis(), mem: cfg.Shape.Bytes(), gpus: cfg.Shape.GPUs}})
		}
	}
	agents, err := w.d.store.ClusterAgents(ctx)
	if err != nil {
		if !stopping(ctx) {
			w.d.log.Warn("could not list attached clusters", "err", err)
		}
		return out
	}
	ag, _ := w.d.agents()
	// By ID, so the same agent of a pool and workspace makes the workers
	// on every replica.
	making := map[string]bool{}
	for _, m := range agents {
		if ag == nil {
			break
		}
		if _, on := ag.Online(m.ID); !on {
			continue // its Jobs stay; the pool's work waits for it
		}
		largest := largestNode(m.Inventory)
		if largest == nil {
			continue // no inventory yet
		}
		key := m.Pool + "/" + m.WorkspaceID
		out = append(out, target{pool: m.Pool, cfg: w.d.config.Worker.Pools[m.Pool], jobs: remoteJobs{d: w.d, agentID: m.ID},
			maxWorkers: attachedMaxWorkers, agentID: m.ID, ws: m.WorkspaceID, keepOnly: making[key],
			shape: bin{cpu: largest.CpuMillis, mem: int64(largest.MemoryBytes), gpus: int(largest.Gpus)}})
		making[key] = true
	}
	return out
}

// podGone gives up what a vanished worker pod was running, at once.
func (w *Workers) podGone(ctx context.Context, g kubeworkers.PodGone) {
	if g.MachineID == "" {
		return
	}
	active, err := w.d.store.ActiveAttempts(ctx, g.MachineID)
	if err != nil {
		w.d.log.Warn("could not read a lost worker's attempts", "machine_id", g.MachineID, "pool", g.Pool, "err", err)
	}
	// Retired before its attempts are lost: a pod being deleted may keep
	// its tunnel for its grace period, and the retry must not be placed
	// on it again.
	w.retire(ctx, g.MachineID)
	for _, a := range active {
		w.rescuer.Lose(ctx, a.TaskID, a.Number, a.MachineID, "worker "+g.Why)
	}
}

// retire deletes a worker's machine (its certificate stops being honoured
// and nothing is placed on it any more). Idempotent.
func (w *Workers) retire(ctx context.Context, machineID string) {
	m, err := w.d.store.MachineByID(ctx, machineID)
	if err != nil || m.DeletedAt != nil {
		return
	}
	if _, err := w.d.store.DeleteMachine(ctx, m.WorkspaceID, m.ID); err != nil {
		w.d.log.Warn("could not delete a finished worker's machine", "machine_id", machineID, "err", err)
	}
}

// joinTimeout is how long a running worker pod may take to come online.
const joinTimeout = 5 * time.Minute

// bin is room for work: a worker's free CPU, memory and GPUs, and what
// this pass put in it.
type bin struct {
	cpu, mem int64
	gpus     int
	// n is how many tasks this pass put in it.
	n int
	// ws is the workspace a new worker is made for (its first task's).
	ws string
	// wk is the worker Job of a starting worker's bin.
	wk kubeworkers.Worker
}

func (b *bin) fits(t store.Task) bool {
	return b.cpu >= t.CPUMillis && b.mem >= t.MemoryBytes && b.gpus >= t.GPUs
}

func (b *bin) take(t store.Task) {
	b.cpu -= t.CPUMillis
	b.mem -= t.MemoryBytes
	b.gpus -= t.GPUs
	b.n++
}

// reconcile does one pass over a target (see Workers).
func (w *Workers) reconcile(ctx context.Context, tg target) error {
	pool := tg.pool
	lock := bus.KubePoolLockKey(pool)
	if tg.agentID != "" {
		lock = bus.KubePoolLockKey(pool + "@" + tg.agentID)
	}
	me := ids.Random(8)
	ok, err := w.d.redis.SetNX(ctx, lock, me, bus.SchedulerLockTTL).Result()
	if err != nil || !ok {
		return err
	}
	defer unlockScript.Run(context.WithoutCancel(ctx), w.d.redis, []string{lock}, me)
	c := tg.jobs
	workers, err := c.List(ctx, pool)
	if err != nil {
		return err
	}
	ag, _ := w.d.agents()
	online := func(id string) bool {
		if ag == nil {
			return false
		}
		_, on := ag.Online(id)
		return on
	}
	live, waiting := 0, false
	var starting []*bin
	for _, wk := range workers {
		if wk.State == kubeworkers.Finished {
			if err := c.Delete(ctx, wk.Name); err != nil {
				w.d.log.Warn("could not remove a finished worker Job", "pool", pool, "job", wk.Name, "err", err)
			} else {
				w.d.log.Info("worker Job removed", "pool", pool, "job", wk.Name, "machine_id", wk.MachineID)
			}
			w.retire(ctx, wk.MachineID)
			continue
		}
		if wk.State == kubeworkers.Running && !online(wk.MachineID) && !wk.Started.IsZero() && w.d.now().Sub(wk.Started) > joinTimeout {
			// Its agent never came online (a wrong controlplane address, a
			// network policy): it would hold the pool's room forever.
			w.d.log.Warn("worker never came online; removing its Job", "pool", pool, "job", wk.Name, "machine_id", wk.MachineID,
				"running_for", w.d.now().Sub(wk.Started).Round(time.Second).String())
			if err := c.Delete(ctx, wk.Name); err == nil {
				w.retire(ctx, wk.MachineID)
			}
			continue
		}
		live++
		waiting = waiting || wk.State == kubeworkers.WaitingForNodes
		if !online(wk.MachineID) {
			starting = append(starting, &bin{cpu: wk.CPUMillis, mem: wk.MemoryBytes, gpus: wk.GPUs, wk: wk})
		}
	}
	pending, err := w.d.store.PendingTasksOfPool(ctx, pool, 1000) // oldest first
	if err != nil {
		return err
	}
	if tg.ws != "" {
		// An attached cluster's workers serve the workspace that joined it.
		pending = slices.DeleteFunc(pending, func(t store.Task) bool { return t.WorkspaceID != tg.ws })
	}
	machineRooms, err := w.d.rooms(ctx, pool)
	if err != nil {
		return err
	}
	var rooms []*bin
	for _, r := range machineRooms {
		if tg.ws != "" && r.workspace != tg.ws {
			continue // counted only where its tasks may go
		}
		rooms = append(rooms, &bin{cpu: r.cpu, mem: r.mem, gpus: len(r.gpus)})
	}
	shape := tg.shape
	// New workers are sized for the work they are made for, packed
	// first-fit into the shape.
	var fresh []*bin
	for _, t := range pending {
		if placeIn(rooms, t) || placeIn(starting, t) || placeIn(fresh, t) {
			continue
		}
		if tg.keepOnly || live+len(fresh) >= tg.maxWorkers {
			continue
		}
		b := shape
		b.ws = t.WorkspaceID
		if !b.fits(t) {
			continue // larger than the shape: submit refuses these
		}
		b.take(t)
		fresh = append(fresh, &b)
	}
	var errs []error
	// A worker not up yet that no waiting task needs any more (its task
	// was cancelled, or ran elsewhere) is removed before it takes a node.
	for _, b := range starting {
		if b.n == 0 && !slices.ContainsFunc(pending, b.fits) {
			wk := b.wk
			if err := c.Delete(ctx, wk.Name); err != nil {
				errs = append(errs, err)
				continue
			}
			w.d.log.Info("worker Job no longer needed, removed", "pool", pool, "job", wk.Name, "machine_id", wk.MachineID)
			w.retire(ctx, wk.MachineID)
			live--
		}
	}
	for _, b := range fresh {
		if err := w.create(ctx, tg, b.ws, store.Task{CPUMillis: shape.cpu - b.cpu, MemoryBytes: shape.mem - b.mem, GPUs: shape.gpus - b.gpus}); err != nil {
			errs = append(errs, err)
			continue
		}
		live++
	}
	if tg.agentID == "" {
		status := strconv.Itoa(live) + " workers"
		if waiting {
			status = "waiting for nodes"
		}
		_ = w.d.redis.Set(ctx, bus.KubePoolStatusKey(pool), strconv.Itoa(live)+"|"+status, bus.KubePoolStatusTTL).Err()
	}
	return errors.Join(errs...)
}

func placeIn(bins []*bin, t store.Task) bool {
	for _, b := range bins {
		if b.fits(t) {
			b.take(t)
			return true
		}
	}
	return false
}

// create makes a worker: a machine with a single-use join token, then its
// Job and the Secret carrying the token. A Job that cannot be made takes
// its machine with it.
func (w *Workers) create(ctx context.Context, tg target, ws string, size store.Task) error {
	pool, cfg := tg.pool, tg.cfg
	now := w.d.now()
	machineID := ids.New("m")
	jtID, token, hash := enroll.MintJoinToken()
	labels := map[string]string{}
	for k, v := range cfg.NodeSelector {
		labels[k] = v // a pool's selector is checked against its machines' labels at enroll
	}
	if tg.agentID != "" {
		// Whose reports about this worker count, and which security its
		// tasks get (dispatch).
		labels[enroll.ClusterWorkerLabel] = tg.agentID
	}
	m := store.Machine{ID: machineID, WorkspaceID: ws, Name: "k8s-" + pool + "-" + machineID[2:10], Pool: pool, CreatedAt: now, Labels: labels}
	if err := w.d.store.CreateMachine(ctx, m, store.JoinTokenRow{ID: jtID, MachineID: m.ID, Hash: hash, ExpiresAt: now.Add(w.d.config.Controlplane.JoinTokenTTL())}); err != nil {
		return fmt.Errorf("creating the machine of a worker Job in pool %s: %w", pool, err)
	}
	var join WorkerJoin
	if w.join != nil {
		join = w.join()
	}
	spec := kubeworkers.Spec{Pool: pool, MachineID: machineID, Image: w.d.config.Worker.WorkerImage(), Controlplane: join.Controlplane,
		CPUMillis: max(size.CPUMillis, 100), MemoryBytes: max(size.MemoryBytes, 64<<20), GPUs: size.GPUs, Enforced: *w.d.config.Worker.JobResourcesEnforced,
		IdleTimeout: cfg.Idle(), AgentArgs: join.AgentArgs}
	if tg.agentID == "" {
		// The scheduling keys are provider kubernetes' only: an attached
		// cluster's pool selects machines, not nodes, with its nodeSelector.
		var tol []corev1.Toleration
		for _, t := range cfg.Tolerations {
			tol = append(tol, corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOperator(t.Operator), Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
		}
		spec.NodeSelector, spec.Tolerations, spec.RuntimeClassName = cfg.NodeSelector, tol, cfg.RuntimeClassName
		spec.PodAnnotations, spec.ImagePullSecrets = cfg.PodAnnotations, w.d.config.Worker.Kubernetes.ImagePullSecrets
	}
	name, err := tg.jobs.Create(ctx, spec, token, join.CAPEM)
	if err != nil {
		if _, derr := w.d.store.DeleteMachine(context.WithoutCancel(ctx), ws, machineID); derr != nil {
			w.d.log.Warn("could not delete the machine of a worker Job that failed", "machine_id", machineID, "err", derr)
		}
		return err
	}
	w.d.log.Info("worker Job created", "pool", pool, "job", name, "machine_id", machineID, "workspace_id", ws, "cluster_agent", tg.agentID,
		"cpu_millis", spec.CPUMillis, "memory_bytes", spec.MemoryBytes, "gpus", spec.GPUs, "join_token_id", jtID)
	return nil
}

// largestNode is an attached cluster's largest node from its agent's
// inventory (nil before it reported one).
func largestNode(inventory []byte) *v1.NodeSize {
	if len(inventory) == 0 {
		return nil
	}
	inv := &v1.Inventory{}
	if err := protojson.Unmarshal(inventory, inv); err != nil {
		return nil
	}
	return inv.GetLargestNode()
}
