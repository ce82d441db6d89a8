package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
)

func terminalTaskStates() []string {
	var out []string
	for _, s := range TaskStates() {
		if s.Terminal() {
			out = append(out, string(s))
		}
	}
	return out
}

// ErrNotPlaced is returned by PlaceAttempt when the task is no longer
// pending, the machine no longer has room, or the machine may not serve
// the task's workspace: the caller moves on.
var ErrNotPlaced = fmt.Errorf("not placed: %w", errdefs.ErrFailedPrecondition)

// Task is a row of tasks.
type Task struct {
	ID              string
	WorkspaceID     string
	Pool            string
	Spec            []byte // protojson TaskSpec
	CPUMillis       int64
	MemoryBytes     int64
	GPUs            int
	GPUType         string
	Retries         int
	State           TaskState
	Attempts        int
	CancelRequested bool
	ExitCode        *int
	Message         string
	IdempotencyKey  string
	CreatedAt       time.Time
	FinishedAt      *time.Time
	// MountFindings are the volume mounts volume mount validation's log
	// mode let through at submit.
	MountFindings []MountFinding
	// Input is TaskSpec.input, stored by InsertTask in its own column and
	// never read back with the task (TaskInput reads it); HasInput says
	// whether there is one.
	Input    []byte
	HasInput bool
}

// MountFinding is a volume mount of a task that volume mount validation
// judged unsafe.
type MountFinding struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Attempt is a row of task_attempts.
type Attempt struct {
	TaskID       string
	Number       int
	MachineID    string
	State        AttemptState
	CPUMillis    int64
	MemoryBytes  int64
	GPUDevices   []string
	ScheduledAt  time.Time
	StartedAt    *time.Time
	FinishedAt   *time.Time
	ExitCode     *int
	Message      string
	DroppedLines int64
	ImageDigest  string
	// Reason says why it failed when the exit code does not; Summary says
	// it in one sentence for people, Message keeps the full chain.
	Reason  Reason
	Summary string
	// AppliedSecurity is the security the runtime really applied (JSON,
	// see SetAppliedSecurity); nil until the agent reported it.
	AppliedSecurity []byte
}

const taskColumns = `id, workspace_id, pool, spec, cpu_millis, memory_bytes, gpus, gpu_type, retries, state, attempts,
	cancel_requested, exit_code, message, coalesce(idempotency_key, ''), created_at, finished_at, mount_findings, input IS NOT NULL`

func scanTask(row interface{ Scan(...any) error }) (Task, error) {
	var t Task
	err := row.Scan(&t.ID, &t.WorkspaceID, &t.Pool, &t.Spec, &t.CPUMillis, &t.MemoryBytes, &t.GPUs, &t.GPUType, &t.Retries,
		&t.State, &t.Attempts, &t.CancelRequested, &t.ExitCode, &t.Message, &t.IdempotencyKey, &t.CreatedAt, &t.FinishedAt, &t.MountFindings,
		&t.HasInput)
	return t, err
}

const attemptColumns = `task_id, number, machine_id, state, cpu_millis, memory_bytes, gpu_devices, scheduled_at, started_at,
	finished_at, exit_code, message, dropped_lines, image_digest, reason, summary, applied_security`

func scanAttempt(row interface{ Scan(...any) error }) (Attempt, error) {
	var a Attempt
	err := row.Scan(&a.TaskID, &a.Number, &a.MachineID, &a.State, &a.CPUMillis, &a.MemoryBytes, &a.GPUDevices, &a.ScheduledAt,
		&a.StartedAt, &a.FinishedAt, &a.ExitCode, &a.Message, &a.DroppedLines, &a.ImageDigest, &a.Reason, &a.Summary,
		&a.AppliedSecurity)
	return a, err
}

// InsertTask stores a new PENDING task. With an idempotency key that the
// workspace used before, it returns that task and existing=true instead.
func (s *Store) InsertTask(ctx context.Context, t Task) (Task, bool, error) {
	var key any
	if t.IdempotencyKey != "" {
		key = t.IdempotencyKey
	}
	findings := t.MountFindings
	if findings == nil {
		findings = []MountFinding{}
	}
	var input any
	if len(t.Input) > 0 {
		input = t.Input
	}
	row := s.pool.QueryRow(ctx, `INSERT INTO tasks (id, workspace_id, pool, spec, cpu_millis, memory_bytes, gpus, gpu_type, retries, state, idempotency_key, created_at, mount_findings, input)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $12, $10, $11, $13, $14)
		ON CONFLICT (workspace_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
		RETURNING `+taskColumns,
		t.ID, t.WorkspaceID, t.Pool, t.Spec, t.CPUMillis, t.MemoryBytes, t.GPUs, t.GPUType, t.Retries, key, t.CreatedAt, TaskPending, findings, input)
	got, err := scanTask(row)
	if err == nil {
		return got, false, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Task{}, false, wrap("insert task", err)
	}
	got, err = scanTask(s.pool.QueryRow(ctx, `SELECT `+taskColumns+` FROM tasks WHERE workspace_id = $1 AND idempotency_key = $2`, t.WorkspaceID, t.IdempotencyKey))
	if err != nil {
		return Task{}, false, wrap("look up task by idempotency key", err)
	}
	return got, true, nil
}

// GetTask returns a task of workspaceID with its attempts in order; empty
// workspaceID looks in every workspace (controlplane-internal callers).
func (s *Store) GetTask(ctx context.Context, workspaceID, id string) (Task, []Attempt, error) {
	t, err := scanTask(s.pool.QueryRow(ctx, `SELECT `+taskColumns+` FROM tasks WHERE id = $1 AND ($2 = '' OR workspace_id = $2)`, id, workspaceID))
	if err != nil {
		return Task{}, nil, wrap("get task "+id, err)
	}
	atts, err := s.attemptsOf(ctx, []string{id})
	if err != nil {
		return Task{}, nil, err
	}
	return t, atts[id], nil
}

func (s *Store) attemptsOf(ctx context.Context, ids []string) (map[string][]Attempt, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+attemptColumns+` FROM task_attempts WHERE task_id = ANY($1) ORDER BY task_id, number`, ids)
	if err != nil {
		return nil, wrap("list attempts", err)
	}
	defer rows.Close()
	out := map[string][]Attempt{}
	for rows.Next() {
		a, err := scanAttempt(rows)
		if err != nil {
			return nil, wrap("read attempt", err)
		}
		out[a.TaskID] = append(out[a.TaskID], a)
	}
	return out, wrap("list attempts", rows.Err())
}

// ListTasks returns up to limit tasks of a workspace, newest first,
// created before (beforeAt, beforeID) when beforeID is set, in the given
// states (all when empty), with their attempts.
func (s *Store) ListTasks(ctx context.Context, workspaceID string, states []TaskState, limit int, beforeAt time.Time, beforeID string) ([]Task, map[string][]Attempt, error) {
	names := []string{} // a nil slice is NULL, and cardinality(NULL) is not 0
	for _, st := range states {
		if !st.Valid() {
			return nil, nil, fmt.Errorf("list tasks: %q is not a task state: %w", st, errdefs.ErrInvalidArgument)
		}
		names = append(names, string(st))
	}
	rows, err := s.pool.Query(ctx, `SELECT `+taskColumns+` FROM tasks
		WHERE workspace_id = $1 AND (cardinality($2::text[]) = 0 OR state = ANY($2))
		  AND ($4 = '' OR (created_at, id) < ($3, $4))
		ORDER BY created_at DESC, id DESC LIMIT $5`, workspaceID, names, beforeAt, beforeID, limit)
	if err != nil {
		return nil, nil, wrap("list tasks", err)
	}
	tasks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Task, error) { return scanTask(r) })
	if err != nil {
		return nil, nil, wrap("list tasks", err)
	}
	ids := make([]string, len(tasks))
	for i, t := range tasks {
		ids[i] = t.ID
	}
	atts, err := s.attemptsOf(ctx, ids)
	return tasks, atts, err
}

// PendingTask is what the queue needs of a pending task.
type PendingTask struct {
	ID, WorkspaceID, Pool string
	CreatedAt             time.Time
}

// PendingTasks lists every PENDING task, oldest first (the queue rescuer
// puts them back into Redis).
func (s *Store) PendingTasks(ctx context.Context, limit int) ([]PendingTask, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, workspace_id, pool, created_at FROM tasks WHERE state = `+sqlPending+` ORDER BY created_at LIMIT $1`, limit)
	if err != nil {
		return nil, wrap("list pending tasks", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PendingTask, error) {
		var p PendingTask
		return p, r.Scan(&p.ID, &p.WorkspaceID, &p.Pool, &p.CreatedAt)
	})
	return out, wrap("list pending tasks", err)
}

// PendingTasksOfPool lists pool's PENDING tasks, oldest first, at most
// limit (the tasks_pending index serves it).
func (s *Store) PendingTasksOfPool(ctx context.Context, pool string, limit int) ([]Task, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+taskColumns+` FROM tasks WHERE state = `+sqlPending+` AND pool = $1 ORDER BY created_at LIMIT $2`, pool, limit)
	if err != nil {
		return nil, wrap("list pending tasks of pool "+pool, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Task, error) { return scanTask(r) })
	return out, wrap("list pending tasks of pool "+pool, err)
}

// PoolMachine is an enrolled machine of a pool with what its active
// attempts hold.
type PoolMachine struct {
	ID string
	// WorkspaceID enrolled the machine; unless the pool is shared, the
	// machine serves only its tasks.
	WorkspaceID string
	Inventory   []byte
	UsedCPU     int64
	UsedMem     int64
	UsedGPUs    []string
	// ClusterWorker says an attached cluster's worker Job enrolled it
	// (enroll.ClusterWorkerLabel).
	ClusterWorker bool
}

// PoolMachines lists the enrolled, undeleted machines of pool in every
// workspace but attached clusters' agents (they run no task: their
// workers do; see ClusterAgents), with the resources their active attempts hold. Which of them
// may serve a task is the caller's to decide (PoolMachine.WorkspaceID);
// PlaceAttempt checks it again.
func (s *Store) PoolMachines(ctx context.Context, pool string) ([]PoolMachine, error) {
	rows, err := s.pool.Query(ctx, `SELECT m.id, m.workspace_id, m.inventory,
			coalesce(sum(a.cpu_millis), 0)::bigint, coalesce(sum(a.memory_bytes), 0)::bigint,
			coalesce(array_agg(g) FILTER (WHERE g IS NOT NULL), '{}'), m.labels ? $3
		FROM machines m
		LEFT JOIN task_attempts a ON a.machine_id = m.id AND a.state IN `+sqlActiveAttempts+`
		LEFT JOIN LATERAL unnest(a.gpu_devices) g ON true
		WHERE m.pool = $1 AND m.enrolled_at IS NOT NULL AND m.deleted_at IS NULL AND NOT m.labels ? $2
		GROUP BY m.id, m.workspace_id, m.inventory, m.labels ORDER BY m.id`, pool, enroll.ClusterAgentLabel, enroll.ClusterWorkerLabel)
	if err != nil {
		return nil, wrap("list machines of pool "+pool, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PoolMachine, error) {
		var m PoolMachine
		return m, r.Scan(&m.ID, &m.WorkspaceID, &m.Inventory, &m.UsedCPU, &m.UsedMem, &m.UsedGPUs, &m.ClusterWorker)
	})
	return out, wrap("list machines of pool "+pool, err)
}

// ActiveByWorkspace counts each workspace's placed, unfinished tasks in pool.
func (s *Store) ActiveByWorkspace(ctx context.Context, pool string) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT workspace_id, count(*) FROM tasks WHERE pool = $1 AND state IN `+sqlActiveTasks+` GROUP BY 1`, pool)
	if err != nil {
		return nil, wrap("count active tasks", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var ws string
		var n int
		if err := rows.Scan(&ws, &n); err != nil {
			return nil, wrap("count active tasks", err)
		}
		out[ws] = n
	}
	return out, wrap("count active tasks", rows.Err())
}

// Capacity is what a machine offers, from its inventory.
type Capacity struct {
	CPUMillis   int64
	MemoryBytes int64
}

// Placement is one task to place on one machine.
type Placement struct {
	TaskID string
	// WorkspaceID is the task's workspace; a task of another workspace is
	// not placed.
	WorkspaceID string
	MachineID   string
	// Shared says the machine's pool serves WorkspaceID's tasks on
	// machines of other workspaces (worker.pools.NAME.shared, and
	// workspaces when set). When false, only a machine WorkspaceID
	// enrolled takes the task.
	Shared bool
	// Capacity is the machine's size, from its inventory.
	Capacity Capacity
	// CPUMillis, MemoryBytes and GPUDevices are what the attempt holds.
	CPUMillis   int64
	MemoryBytes int64
	GPUDevices  []string
}

// PlaceAttempt moves a PENDING task to SCHEDULED with a new attempt on
// p.MachineID holding p's resources. It locks the machine row and
// re-checks, inside the transaction, that the machine may serve the
// task's workspace and still has room for it against p.Capacity, so
// replicas placing at the same time never overbook a machine or place a
// task twice, and a scheduler's mistake never puts a task on another
// workspace's machine. ErrNotPlaced means one of those checks failed.
func (s *Store) PlaceAttempt(ctx context.Context, p Placement) (Attempt, error) {
	gpuDevices := p.GPUDevices
	if gpuDevices == nil {
		gpuDevices = []string{} // NULL would break gpu_devices' NOT NULL
	}
	// One round trip, one implicit transaction (a placement is on the path
	// of every task's start): the first statement takes the machine's
	// lock, and the second, which under READ COMMITTED reads a snapshot
	// taken after the lock was granted, sees every attempt an earlier
	// holder committed. It places nothing when a check fails.
	b := &pgx.Batch{}
	b.Queue(`SELECT 1 FROM machines WHERE id = $1 FOR UPDATE`, p.MachineID).
		QueryRow(func(r pgx.Row) error { return r.Scan(nil) })
	var a Attempt
	var placed bool
	b.Queue(`WITH m AS (
			SELECT 1 FROM machines WHERE id = $1 AND deleted_at IS NULL AND (workspace_id = $2 OR $3::bool)),
		used AS (
			SELECT coalesce(sum(cpu_millis), 0)::bigint AS cpu, coalesce(sum(memory_bytes), 0)::bigint AS mem,
				coalesce(bool_or(gpu_devices && $4::text[]), false) AS clash
			FROM task_attempts WHERE machine_id = $1 AND state IN `+sqlActiveAttempts+`),
		t AS (
			UPDATE tasks SET state = $5, attempts = attempts + 1, updated_at = now()
			WHERE id = $6 AND state = ANY($7) AND NOT cancel_requested AND workspace_id = $2
				AND EXISTS (SELECT 1 FROM m)
				AND (SELECT NOT clash AND cpu + $8 <= $9 AND mem + $10 <= $11 FROM used)
			RETURNING attempts)
		INSERT INTO task_attempts (task_id, number, machine_id, state, cpu_millis, memory_bytes, gpu_devices)
		SELECT $6, attempts, $1, $12, $8, $10, $4 FROM t RETURNING `+attemptColumns,
		p.MachineID, p.WorkspaceID, p.Shared, gpuDevices, TaskScheduled, p.TaskID, TaskScheduled.sources(),
		p.CPUMillis, p.Capacity.CPUMillis, p.MemoryBytes, p.Capacity.MemoryBytes, AttemptScheduled).
		QueryRow(func(r pgx.Row) error {
			var err error
			if a, err = scanAttempt(r); errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			placed = err == nil
			return err
		})
	err := s.pool.SendBatch(ctx, b).Close()
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Only the lock's row can be missing: the placement's own
		// missing row is !placed.
		return Attempt{}, wrap("lock machine "+p.MachineID, err)
	case err != nil:
		return Attempt{}, wrap("place task "+p.TaskID, err)
	case !placed:
		return Attempt{}, ErrNotPlaced
	}
	return a, nil
}

// MarkRunning records that an attempt's container started, and the
// security its runtime really applied (a JSON object the caller encodes;
// nil for none), stored once: a repeated report leaves the first value. It
// reports whether the state changed (false for a repeat or a stale
// attempt). Both changes go in one round trip and one implicit
// transaction: this is on the path of every task's first output line.
func (s *Store) MarkRunning(ctx context.Context, taskID string, n int, at time.Time, applied []byte) (bool, error) {
	if applied != nil {
		if err := checkApplied(applied); err != nil {
			return false, fmt.Errorf("attempt %s/%d: %w", taskID, n, err)
		}
	}
	b := &pgx.Batch{}
	var changed int
	b.Queue(`WITH a AS (
			UPDATE task_attempts SET state = $4, started_at = $3
			WHERE task_id = $1 AND number = $2 AND state = ANY($5)
			RETURNING task_id),
		t AS (
			UPDATE tasks SET state = $6, updated_at = now()
			WHERE id IN (SELECT task_id FROM a) AND attempts = $2 AND state = ANY($7))
		SELECT count(*) FROM a`, taskID, n, at, AttemptRunning, AttemptRunning.sources(), TaskRunning, TaskRunning.sources()).
		QueryRow(func(r pgx.Row) error { return r.Scan(&changed) })
	if applied != nil {
		b.Queue(`UPDATE task_attempts SET applied_security = $3
			WHERE task_id = $1 AND number = $2 AND applied_security IS NULL`, taskID, n, applied)
	}
	return changed > 0, wrap("mark attempt running", s.pool.SendBatch(ctx, b).Close())
}

// AttemptEnd is how an attempt finished on its machine.
type AttemptEnd struct {
	State        AttemptState // SUCCEEDED, FAILED, CANCELLED or TIMED_OUT
	ExitCode     *int
	Message      string
	DroppedLines int64
	ImageDigest  string
	// Reason and Summary say why a FAILED attempt failed when its exit
	// code does not (see Reason).
	Reason  Reason
	Summary string
	// Result is what the container left in /run/levers9/io/result.
	Result AttemptResult
	At     time.Time
}

// FinishAttempt records an attempt's end and makes it the task's result.
// It reports whether anything changed (false for a repeat, or for an
// attempt already given up as lost).
func (s *Store) FinishAttempt(ctx context.Context, taskID string, n int, e AttemptEnd) (bool, error) {
	_, changed, err := s.EndAttempt(ctx, taskID, n, e)
	return changed, err
}

// EndAttempt records an attempt's end and decides the task: the attempt's
// end, except for a FAILED attempt whose reason is the machine's fault
// (Reason.MachineFault), which decides the task as a lost attempt does
// (CANCELLED when a cancel was asked for, PENDING again while retries
// remain, else FAILED). taskState is the task's new state when changed.
func (s *Store) EndAttempt(ctx context.Context, taskID string, n int, e AttemptEnd) (taskState TaskState, changed bool, err error) {
	end, ok := e.State.TaskEnd()
	if !ok {
		return "", false, fmt.Errorf("finish attempt %s/%d: %q is not an attempt's end: %w", taskID, n, e.State, errdefs.ErrInvalidArgument)
	}
	if !e.Reason.Valid() {
		return "", false, fmt.Errorf("finish attempt %s/%d: unknown reason %q: %w", taskID, n, e.Reason, errdefs.ErrInvalidArgument)
	}
	retry := e.State == AttemptFailed && e.Reason.MachineFault()
	err = s.tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE task_attempts SET state = $3, exit_code = $4, message = $5, dropped_lines = $6,
				image_digest = $7, finished_at = $8, started_at = coalesce(started_at, $8), reason = $10, summary = $11,
				result = $12, result_error = $13
			WHERE task_id = $1 AND number = $2 AND state = ANY($9)`,
			taskID, n, e.State, e.ExitCode, e.Message, e.DroppedLines, e.ImageDigest, e.At, e.State.sources(), e.Reason, e.Summary,
			e.Result.column(), e.Result.Err)
		if err != nil {
			return wrap("finish attempt", err)
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		changed = true
		if retry {
			err = tx.QueryRow(ctx, `UPDATE tasks SET updated_at = now(),
					state = CASE WHEN cancel_requested THEN $4 WHEN attempts < 1 + retries THEN $5 ELSE $6 END,
					message = CASE WHEN cancel_requested THEN 'cancelled' WHEN attempts < 1 + retries THEN message ELSE $3 END,
					exit_code = NULL,
					finished_at = CASE WHEN cancel_requested OR attempts >= 1 + retries THEN $7::timestamptz END
				WHERE id = $1 AND attempts = $2 AND state IN `+sqlActiveTasks+` RETURNING state`,
				taskID, n, e.Message, TaskCancelled, TaskPending, TaskFailed, e.At).Scan(&taskState)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return wrap("decide task after a failed start", err)
		}
		tag, err = tx.Exec(ctx, `UPDATE tasks SET state = $3, exit_code = $4, message = $5, finished_at = $6, updated_at = now()
			WHERE id = $1 AND attempts = $2 AND state IN `+sqlActiveTasks, taskID, n, end, e.ExitCode, e.Message, e.At)
		if err == nil && tag.RowsAffected() > 0 {
			taskState = end
		}
		return wrap("finish task", err)
	})
	return taskState, changed, err
}

// LoseAttempt marks an active attempt LOST and decides the task: CANCELLED
// when a cancel was asked for, PENDING again when retries remain, else
// FAILED. changed is false when the attempt was not active any more.
func (s *Store) LoseAttempt(ctx context.Context, taskID string, n int, why string) (taskState TaskState, changed bool, err error) {
	err = s.tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE task_attempts SET state = $4, message = $3, finished_at = now()
			WHERE task_id = $1 AND number = $2 AND state = ANY($5)`, taskID, n, why, AttemptLost, AttemptLost.sources())
		if err != nil {
			return wrap("mark attempt lost", err)
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		changed = true
		err = tx.QueryRow(ctx, `UPDATE tasks SET updated_at = now(),
				state = CASE WHEN cancel_requested THEN $4 WHEN attempts < 1 + retries THEN $5 ELSE $6 END,
				message = CASE WHEN cancel_requested THEN 'cancelled' WHEN attempts < 1 + retries THEN message
					ELSE format('attempt %s lost (%s) and no retries left', attempts, $3::text) END,
				finished_at = CASE WHEN cancel_requested OR attempts >= 1 + retries THEN now() END
			WHERE id = $1 AND attempts = $2 AND state IN `+sqlActiveTasks+` RETURNING state`,
			taskID, n, why, TaskCancelled, TaskPending, TaskFailed).Scan(&taskState)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return wrap("decide lost task", err)
	})
	return taskState, changed, err
}

// ActiveAttempt is an attempt still holding a machine.
type ActiveAttempt struct {
	TaskID          string
	Number          int
	MachineID       string
	ScheduledAt     time.Time
	CancelRequested bool
	MachineDeleted  bool
}

// ActiveAttempts lists active attempts, of one machine when machineID is
// set.
func (s *Store) ActiveAttempts(ctx context.Context, machineID string) ([]ActiveAttempt, error) {
	rows, err := s.pool.Query(ctx, `SELECT a.task_id, a.number, a.machine_id, a.scheduled_at, t.cancel_requested,
			m.id IS NULL OR m.deleted_at IS NOT NULL
		FROM task_attempts a JOIN tasks t ON t.id = a.task_id LEFT JOIN machines m ON m.id = a.machine_id
		WHERE a.state IN `+sqlActiveAttempts+` AND ($1 = '' OR a.machine_id = $1)`, machineID)
	if err != nil {
		return nil, wrap("list active attempts", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ActiveAttempt, error) {
		var a ActiveAttempt
		return a, r.Scan(&a.TaskID, &a.Number, &a.MachineID, &a.ScheduledAt, &a.CancelRequested, &a.MachineDeleted)
	})
	return out, wrap("list active attempts", err)
}

// AttemptWanted reports whether the controlplane still wants an attempt
// to run on machineID: it exists there, is active and no cancel was asked.
func (s *Store) AttemptWanted(ctx context.Context, machineID, taskID string, n int) (bool, error) {
	var wanted bool
	err := s.pool.QueryRow(ctx, `SELECT a.state IN `+sqlActiveAttempts+` AND NOT t.cancel_requested
		FROM task_attempts a JOIN tasks t ON t.id = a.task_id
		WHERE a.task_id = $1 AND a.number = $2 AND a.machine_id = $3`, taskID, n, machineID).Scan(&wanted)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return wanted, wrap("look up attempt", err)
}

// AttemptOwner returns the workspace of a task attempt that ran or runs on
// machineID (not found otherwise: an agent may only report its own), and
// whether it is still wanted there (as AttemptWanted), in one query.
func (s *Store) AttemptOwner(ctx context.Context, machineID, taskID string, n int) (workspace string, wanted bool, err error) {
	err = s.pool.QueryRow(ctx, `SELECT t.workspace_id, a.state IN `+sqlActiveAttempts+` AND NOT t.cancel_requested
		FROM task_attempts a JOIN tasks t ON t.id = a.task_id
		WHERE a.task_id = $1 AND a.number = $2 AND a.machine_id = $3`, taskID, n, machineID).Scan(&workspace, &wanted)
	return workspace, wanted, wrap(fmt.Sprintf("attempt %s/%d on machine %s", taskID, n, machineID), err)
}

// RequestCancel asks a task of workspaceID to stop. A PENDING task becomes
// CANCELLED at once; a placed one keeps its state until its machine
// reports (or is lost). It returns the task after the change.
func (s *Store) RequestCancel(ctx context.Context, workspaceID, id string) (Task, error) {
	t, err := scanTask(s.pool.QueryRow(ctx, `UPDATE tasks SET cancel_requested = true, updated_at = now(),
			state = CASE WHEN state = $3 THEN $4 ELSE state END,
			message = CASE WHEN state = $3 THEN 'cancelled before it was placed' ELSE message END,
			finished_at = CASE WHEN state = $3 THEN now() ELSE finished_at END
		WHERE id = $1 AND workspace_id = $2 AND state <> ALL($5)
		RETURNING `+taskColumns, id, workspaceID, TaskPending, TaskCancelled, terminalTaskStates()))
	if errors.Is(err, pgx.ErrNoRows) {
		t, _, err = s.GetTask(ctx, workspaceID, id)
		return t, err
	}
	return t, wrap("cancel task "+id, err)
}
