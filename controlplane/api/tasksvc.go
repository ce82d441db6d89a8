package api

import (
	"context"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/internal/errdefs"
)

// TaskService submits, lists, cancels and follows the workspace's tasks;
// controlplane/tasks does the work.
type TaskService struct {
	v1.UnimplementedTaskServiceServer
	*Deps
}

func (s *TaskService) SubmitTask(ctx context.Context, req *v1.SubmitTaskRequest) (*v1.SubmitTaskResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	t, existing, err := s.Tasks.Submit(ctx, p.WorkspaceID, req.GetSpec(), req.GetIdempotencyKey())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.SubmitTaskResponse{Task: t, Existing: existing}, nil
}

func (s *TaskService) GetTask(ctx context.Context, req *v1.GetTaskRequest) (*v1.GetTaskResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	t, err := s.Tasks.Get(ctx, p.WorkspaceID, req.GetId())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.GetTaskResponse{Task: t}, nil
}

func (s *TaskService) ListTasks(ctx context.Context, req *v1.ListTasksRequest) (*v1.ListTasksResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	ts, next, err := s.Tasks.List(ctx, p.WorkspaceID, req.GetStates(), int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.ListTasksResponse{Tasks: ts, NextPageToken: next}, nil
}

func (s *TaskService) CancelTask(ctx context.Context, req *v1.CancelTaskRequest) (*v1.CancelTaskResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	t, err := s.Tasks.Cancel(ctx, p.WorkspaceID, req.GetId())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.CancelTaskResponse{Task: t}, nil
}

// GetTaskResult returns what the task's last attempt left in
// /run/levers9/io/result, once the task has ended.
func (s *TaskService) GetTaskResult(ctx context.Context, req *v1.GetTaskResultRequest) (*v1.GetTaskResultResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	resp, err := s.Tasks.Result(ctx, p.WorkspaceID, req.GetId())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return resp, nil
}

func (s *TaskService) FollowTask(req *v1.FollowTaskRequest, stream v1.TaskService_FollowTaskServer) error {
	ctx := stream.Context()
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return errdefs.ToGRPC(err)
	}
	return errdefs.ToGRPC(s.Tasks.Follow(ctx, p.WorkspaceID, req.GetId(), req.GetCursor(), req.GetNoWait(), stream.Send))
}
