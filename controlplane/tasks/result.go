package tasks

import (
	"context"
	"fmt"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// The result channel: a task's input goes to every attempt (Submit keeps
// it apart from the spec, dispatch's attachInput hands it down), and what
// the attempt's container left in /run/levers9/io/result comes back with
// its terminal update (intake) and is read by GetTaskResult.

// MaxResultBytes bounds a stored result: an agent keeps to it (or less,
// under a smaller tunnel message limit), and a larger one from an agent
// that does not is recorded as too large.
const MaxResultBytes = store.MaxResultBytes

// resultOf is the store's form of the result an agent reported.
func resultOf(r *agentv1.AttemptResult) store.AttemptResult {
	if r == nil {
		return store.AttemptResult{}
	}
	if n := len(r.GetData()); n > MaxResultBytes {
		return store.AttemptResult{Err: fmt.Sprintf("the result is %d bytes; the limit is %d MiB", n, MaxResultBytes>>20)}
	}
	if !r.GetPresent() {
		return store.AttemptResult{Err: r.GetError()}
	}
	return store.AttemptResult{Present: true, Data: r.GetData()}
}

// Result returns what a task of the workspace's last attempt left as its
// result. NotFound for no such task, and for a task that has not ended.
func (s *Submitter) Result(ctx context.Context, workspaceID, id string) (*v1.GetTaskResultResponse, error) {
	r, err := s.d.store.GetTaskResult(ctx, workspaceID, id)
	if err != nil {
		return nil, err
	}
	if !r.State.Terminal() {
		return nil, fmt.Errorf("task %s has not ended (it is %s): %w", id, r.State, errdefs.ErrNotFound)
	}
	return &v1.GetTaskResultResponse{Attempt: int32(r.Attempt), Present: r.Result.Present, Result: r.Result.Data, Error: r.Result.Err}, nil
}

// Result returns a task's result (see Submitter.Result).
func (s *Service) Result(ctx context.Context, workspaceID, id string) (*v1.GetTaskResultResponse, error) {
	return s.Submitter.Result(ctx, workspaceID, id)
}
