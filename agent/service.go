package agent

import (
	"context"
	"fmt"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/internal/errdefs"
)

// agentService is the Agent API the controlplane calls over the tunnel.
type agentService struct {
	agentv1.UnimplementedAgentServer
	machineID string
	tasks     *tasks // nil: this agent runs no tasks
}

var _ agentv1.AgentServer = (*agentService)(nil)

func (s *agentService) Ping(_ context.Context, req *agentv1.PingRequest) (*agentv1.PingResponse, error) {
	return &agentv1.PingResponse{MachineId: s.machineID, Payload: req.Payload}, nil
}

var errNoRunner = fmt.Errorf("this agent runs no tasks (no task runner): %w", errdefs.ErrFailedPrecondition)

// RunTask takes the attempt and returns at once; it is in ListTasks and
// the next heartbeat from then on. Its progress goes through ReportAttempt.
//
// On a new session it first waits (briefly, bounded by ctx) for the
// session's gate: see sessionGate.
func (s *agentService) RunTask(ctx context.Context, req *agentv1.RunTaskRequest) (*agentv1.RunTaskResponse, error) {
	if s.tasks == nil {
		return nil, errdefs.ToGRPC(errNoRunner)
	}
	already, err := s.tasks.run(ctx, req.Attempt)
	if errdefs.HasReason(err, errdefs.ReasonAgentNotReady) {
		return nil, err
	}
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &agentv1.RunTaskResponse{AlreadyRunning: already}, nil
}

// CancelTask ends the attempt's kill context: the container is killed and
// cleaned up, and its terminal record (CANCELLED) still goes out.
func (s *agentService) CancelTask(_ context.Context, req *agentv1.CancelTaskRequest) (*agentv1.CancelTaskResponse, error) {
	if s.tasks == nil {
		return &agentv1.CancelTaskResponse{}, nil
	}
	reason := "cancelled by the controlplane"
	if req.Reason != "" {
		reason += ": " + req.Reason
	}
	return &agentv1.CancelTaskResponse{Found: s.tasks.cancel(req.TaskId, req.Attempt, reason)}, nil
}

func (s *agentService) ListTasks(context.Context, *agentv1.ListTasksRequest) (*agentv1.ListTasksResponse, error) {
	if s.tasks == nil {
		return &agentv1.ListTasksResponse{}, nil
	}
	return &agentv1.ListTasksResponse{Attempts: s.tasks.list()}, nil
}
