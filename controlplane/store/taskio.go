package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/levers9/levers9/internal/errdefs"
)

// The result channel's columns (migrations/00017_task_io.sql): a task's
// input beside its spec, an attempt's result beside its end. They are
// read here only, never with the task and attempt lists.

// MaxInputBytes and MaxResultBytes are the CHECK bounds of tasks.input
// and task_attempts.result.
const (
	MaxInputBytes  = 1 << 20
	MaxResultBytes = 8 << 20
)

// AttemptResult is what an attempt's container left as its result.
type AttemptResult struct {
	// Present is set when it wrote one within the limit; Data may then be
	// empty (an empty file).
	Present bool
	Data    []byte
	// Err says why a result that was written is not kept.
	Err string
}

// column is the result as task_attempts.result holds it: NULL when none,
// bytes (possibly none) when present.
func (r AttemptResult) column() any {
	if !r.Present {
		return nil
	}
	if r.Data == nil {
		return []byte{}
	}
	return r.Data
}

// TaskInput returns a task's input (nil when it has none).
func (s *Store) TaskInput(ctx context.Context, id string) ([]byte, error) {
	var in []byte
	err := s.pool.QueryRow(ctx, `SELECT input FROM tasks WHERE id = $1`, id).Scan(&in)
	return in, wrap("read the input of task "+id, err)
}

// TaskResult is a task's state and its latest attempt's result.
type TaskResult struct {
	State TaskState
	// Attempt is the latest attempt's number (0: never placed).
	Attempt int
	Result  AttemptResult
}

// GetTaskResult returns a task of workspaceID with the result of its
// latest attempt (an earlier, lost attempt's never counts). NotFound when
// the workspace has no such task.
func (s *Store) GetTaskResult(ctx context.Context, workspaceID, id string) (TaskResult, error) {
	var (
		r      TaskResult
		data   []byte
		errTxt string
	)
	err := s.pool.QueryRow(ctx, `SELECT t.state, t.attempts, a.result, coalesce(a.result_error, '')
		FROM tasks t LEFT JOIN task_attempts a ON a.task_id = t.id AND a.number = t.attempts
		WHERE t.id = $1 AND t.workspace_id = $2`, id, workspaceID).Scan(&r.State, &r.Attempt, &data, &errTxt)
	if errors.Is(err, pgx.ErrNoRows) {
		return TaskResult{}, fmt.Errorf("no task %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return TaskResult{}, wrap("read the result of task "+id, err)
	}
	// pgx scans an empty bytea as an empty, non-nil slice and NULL as nil.
	r.Result = AttemptResult{Present: data != nil, Data: data, Err: errTxt}
	return r, nil
}
