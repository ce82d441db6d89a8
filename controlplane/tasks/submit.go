package tasks

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

// Submitter is the task API's way in: submit (validation, idempotency
// keys, the first queueing), cancel, and the reads. Its only goroutines
// are the pushes that stop a cancelled task's attempt on its machine,
// which Stop waits for; before Start (or after Stop) a cancel is still
// recorded, and the machine hears it in its next heartbeat's answer.
type Submitter struct {
	d      *deps
	q      *queue
	events *Events
	wake   func()
	life   lifecycle
}

func newSubmitter(d *deps, q *queue, ev *Events, wake func()) *Submitter {
	return &Submitter{d: d, q: q, events: ev, wake: wake, life: lifecycle{name: "submitter"}}
}

// Start lets cancels push to agents until Stop.
func (s *Submitter) Start(ctx context.Context) error {
	_, err := s.life.begin(ctx)
	return err
}

// Stop cancels the pushes in flight and waits for them.
func (s *Submitter) Stop() { s.life.stop() }

// Submit validates spec, stores the task and queues it. With an idempotency
// key used before in the workspace it returns that task (existing=true).
func (s *Submitter) Submit(ctx context.Context, workspaceID string, spec *v1.TaskSpec, key string) (*v1.Task, bool, error) {
	if strings.HasPrefix(key, BuildKeyPrefix) {
		return nil, false, fmt.Errorf("task spec: idempotency_key: %q is reserved for image builds: %w", BuildKeyPrefix, errdefs.ErrInvalidArgument)
	}
	return s.submit(ctx, workspaceID, spec, key)
}

func (s *Submitter) submit(ctx context.Context, workspaceID string, spec *v1.TaskSpec, key string) (*v1.Task, bool, error) {
	spec, note, findings, err := s.resolve(ctx, workspaceID, spec, key)
	if err != nil {
		return nil, false, err
	}
	// The input goes to its own column: task reads never carry it.
	input := spec.Input
	spec.Input = nil
	specJSON, err := protojson.Marshal(spec)
	if err != nil {
		return nil, false, fmt.Errorf("encode task spec: %w", err)
	}
	row, existing, err := s.d.store.InsertTask(ctx, store.Task{ID: ids.New("t"), WorkspaceID: workspaceID, Pool: spec.Pool, Spec: specJSON,
		CPUMillis: spec.CpuMillis, MemoryBytes: int64(spec.MemoryBytes), GPUs: int(spec.Gpus), GPUType: spec.GpuType,
		Retries: int(spec.Retries), IdempotencyKey: key, CreatedAt: s.d.now(), MountFindings: findings, Input: input})
	if err != nil {
		return nil, false, err
	}
	if !existing {
		msg := "queued in pool " + row.Pool
		if note != "" {
			msg += ": " + note
		}
		s.events.publishState(ctx, row.ID, 0, &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_PENDING, Message: msg})
		if len(row.MountFindings) > 0 {
			s.events.Publish(ctx, row.ID, &v1.TaskEvent{Event: &v1.TaskEvent_Mounts{Mounts: &v1.MountsLogged{Findings: mountFindingsPB(row.MountFindings)}}})
			s.d.log.Warn("volume mounts allowed in log mode that enforce would refuse", "task_id", row.ID, "pool", row.Pool, "findings", row.MountFindings)
		}
		if err := s.q.add(ctx, store.PendingTask{ID: row.ID, WorkspaceID: workspaceID, Pool: row.Pool, CreatedAt: row.CreatedAt}); err != nil {
			// The rescuer puts it back from Postgres; the task is not lost.
			s.d.log.Warn("task not queued in Redis yet", "task_id", row.ID, "err", err)
		}
		s.wake()
	}
	t, err := s.Get(ctx, workspaceID, row.ID)
	return t, existing, err
}

// Get returns a task of the workspace, with what seccomp log mode
// recorded for it.
func (s *Submitter) Get(ctx context.Context, workspaceID, id string) (*v1.Task, error) {
	t, atts, err := s.d.store.GetTask(ctx, workspaceID, id)
	if err != nil {
		return nil, err
	}
	sc, err := s.d.store.TaskSeccomp(ctx, t.ID)
	if err != nil {
		return nil, err
	}
	out := taskPB(t, atts)
	for _, c := range sc {
		out.SeccompLogged = append(out.SeccompLogged, &v1.SeccompSyscall{Syscall: c.Syscall, Count: uint64(c.Count)})
	}
	return out, nil
}

// List returns a page of the workspace's tasks, newest first.
func (s *Submitter) List(ctx context.Context, workspaceID string, states []v1.TaskState, size int, token string) ([]*v1.Task, string, error) {
	if size == 0 {
		size = 50
	}
	if size < 1 || size > 500 {
		return nil, "", fmt.Errorf("page_size %d is not in 1..500: %w", size, errdefs.ErrInvalidArgument)
	}
	beforeAt, beforeID, err := parsePageToken(token)
	if err != nil {
		return nil, "", err
	}
	var want []store.TaskState
	for _, st := range states {
		name, ok := taskStateOf(st)
		if !ok {
			return nil, "", fmt.Errorf("states: %v is not a task state: %w", st, errdefs.ErrInvalidArgument)
		}
		want = append(want, name)
	}
	rows, atts, err := s.d.store.ListTasks(ctx, workspaceID, want, size, beforeAt, beforeID)
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

// parsePageToken reads a token List returned: "<unix nanos>_t_<id>".
func parsePageToken(token string) (time.Time, string, error) {
	if token == "" {
		return time.Time{}, "", nil
	}
	at, id, ok := strings.Cut(token, "_t_")
	ns, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil {
		return time.Time{}, "", fmt.Errorf("page_token is not one this API returned: %w", errdefs.ErrInvalidArgument)
	}
	return time.Unix(0, ns), "t_" + id, nil
}

// Cancel stops a task: a pending one at once, a placed one through its
// agent (or as lost, if its machine is gone).
func (s *Submitter) Cancel(ctx context.Context, workspaceID, id string) (*v1.Task, error) {
	t, err := s.d.store.RequestCancel(ctx, workspaceID, id)
	s.d.placed.forget(id)
	if err != nil {
		return nil, err
	}
	switch t.State {
	case store.TaskCancelled:
		if t.Attempts == 0 || t.FinishedAt != nil {
			s.q.remove(ctx, t.Pool, t.WorkspaceID, t.ID)
			s.events.publishState(ctx, t.ID, t.Attempts, &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_CANCELLED, Message: t.Message})
		}
	case store.TaskScheduled, store.TaskRunning:
		if _, atts, err := s.d.store.GetTask(ctx, workspaceID, id); err == nil && len(atts) > 0 {
			s.pushCancel(atts[len(atts)-1])
		}
	}
	return s.Get(ctx, workspaceID, id)
}

// pushCancel tells an attempt's agent to stop it, in the background.
func (s *Submitter) pushCancel(a store.Attempt) {
	s.life.goRun(func(run context.Context) {
		ctx, cancel := context.WithTimeout(run, pushTimeout)
		defer cancel()
		c, err := s.d.conn(ctx, a.MachineID)
		if err == nil {
			_, err = c.CancelTask(ctx, &agentv1.CancelTaskRequest{TaskId: a.TaskID, Attempt: int32(a.Number), Reason: "cancelled by the user"})
		}
		if err != nil && !stopping(run) {
			s.d.log.Warn("push to agent failed", "call", "cancel", "task_id", a.TaskID, "machine_id", a.MachineID, "err", err)
		}
	})
}
