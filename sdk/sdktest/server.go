// Package sdktest serves a scripted TaskService for tests of the SDK and
// the CLI: tests append a task's events (output lines, state changes,
// attempts) by hand and cut follow streams on request, to check what no
// real agent can produce on demand (several attempts, a stream dropped at
// an exact event). Tests of everything a real controlplane can do use
// controlplane/controlplanetest instead. Test-only.
package sdktest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/testenv"
)

// Token is the only bearer token the server accepts.
const Token = "sdktest-token"

// Server is a scripted TaskService on a free 127.0.0.1 port. Safe for
// concurrent use.
type Server struct {
	v1.UnimplementedTaskServiceServer
	Addr string

	// mu guards everything below.
	mu      sync.Mutex
	tasks   map[string]*task
	byKey   map[string]string
	order   []string
	next    int
	changed chan struct{}
	// cutAfter, when positive, ends the next follow streams with
	// Unavailable after that many events each (cuts counts down).
	cutAfter, cuts int
	// eofAfter ends the next follow streams cleanly (as a stopping server
	// might) after that many events each.
	eofAfter, eofs int
	follows        []string
	submits        int
	// loseReplies makes the next submits store the task but answer
	// Unavailable, as when the reply is lost on the way.
	loseReplies int
	cancels     []string
	// onCancel, when set, runs (with mu held) when a task is cancelled,
	// instead of ending it at once.
	onCancel func(id string)
}

type task struct {
	t      *v1.Task
	events []*v1.TaskEvent
	// result is what GetTaskResult answers once the task ended (nil: no
	// result).
	result *v1.GetTaskResultResponse
}

// Start serves until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: lis.Addr().String(), tasks: map[string]*task{}, byKey: map[string]string{}, changed: make(chan struct{})}
	g := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := auth(ctx); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}), grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := auth(ss.Context()); err != nil {
			return err
		}
		return h(srv, ss)
	}))
	v1.RegisterTaskServiceServer(g, s)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return s
}

func auth(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) != 1 || v[0] != "Bearer "+Token {
		return status.Error(codes.Unauthenticated, "bad token")
	}
	return nil
}

// broadcastLocked wakes followers.
func (s *Server) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) SubmitTask(_ context.Context, req *v1.SubmitTaskRequest) (*v1.SubmitTaskResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.submits++
	if id, ok := s.byKey[req.IdempotencyKey]; ok && req.IdempotencyKey != "" {
		if s.loseReplies > 0 {
			s.loseReplies--
			return nil, status.Error(codes.Unavailable, "sdktest: reply lost")
		}
		return &v1.SubmitTaskResponse{Task: proto.Clone(s.tasks[id].t).(*v1.Task), Existing: true}, nil
	}
	if req.GetSpec().GetGpus() > 0 {
		return nil, status.Error(codes.FailedPrecondition, "pool default has no GPUs")
	}
	s.next++
	id := fmt.Sprintf("t_test%d", s.next)
	tk := &task{t: &v1.Task{Id: id, Spec: req.Spec, State: v1.TaskState_TASK_STATE_PENDING, CreatedAt: timestamppb.Now(), IdempotencyKey: req.IdempotencyKey}}
	s.tasks[id] = tk
	s.order = append(s.order, id)
	if req.IdempotencyKey != "" {
		s.byKey[req.IdempotencyKey] = id
	}
	s.appendLocked(tk, 0, &v1.TaskEvent_State{State: &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_PENDING}})
	if s.loseReplies > 0 {
		s.loseReplies--
		return nil, status.Error(codes.Unavailable, "sdktest: reply lost")
	}
	return &v1.SubmitTaskResponse{Task: proto.Clone(tk.t).(*v1.Task)}, nil
}

func (s *Server) GetTask(_ context.Context, req *v1.GetTaskRequest) (*v1.GetTaskResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tk, ok := s.tasks[req.Id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "task %s not found", req.Id)
	}
	return &v1.GetTaskResponse{Task: proto.Clone(tk.t).(*v1.Task)}, nil
}

func (s *Server) ListTasks(_ context.Context, req *v1.ListTasksRequest) (*v1.ListTasksResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &v1.ListTasksResponse{}
	for i := len(s.order) - 1; i >= 0; i-- {
		resp.Tasks = append(resp.Tasks, proto.Clone(s.tasks[s.order[i]].t).(*v1.Task))
	}
	return resp, nil
}

func (s *Server) CancelTask(_ context.Context, req *v1.CancelTaskRequest) (*v1.CancelTaskResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tk, ok := s.tasks[req.Id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "task %s not found", req.Id)
	}
	s.cancels = append(s.cancels, req.Id)
	if !terminal(tk.t.State) {
		if s.onCancel != nil {
			s.onCancel(req.Id)
		} else {
			s.endLocked(tk, v1.TaskState_TASK_STATE_CANCELLED, v1.AttemptState_ATTEMPT_STATE_CANCELLED, nil, "cancelled by a user")
		}
	}
	return &v1.CancelTaskResponse{Task: proto.Clone(tk.t).(*v1.Task)}, nil
}

func terminal(s v1.TaskState) bool {
	return s >= v1.TaskState_TASK_STATE_SUCCEEDED
}

// FollowTask sends the task's events after the cursor (an event index)
// and ends after the terminal one, unless a cut was asked for.
func (s *Server) FollowTask(req *v1.FollowTaskRequest, stream grpc.ServerStreamingServer[v1.TaskEvent]) error {
	s.mu.Lock()
	tk, ok := s.tasks[req.Id]
	s.follows = append(s.follows, req.Cursor)
	cut, eof := -1, -1
	if s.cuts > 0 {
		s.cuts--
		cut = s.cutAfter
	} else if s.eofs > 0 {
		s.eofs--
		eof = s.eofAfter
	}
	s.mu.Unlock()
	if !ok {
		return status.Errorf(codes.NotFound, "task %s not found", req.Id)
	}
	next := 0
	if req.Cursor != "" {
		n, err := strconv.Atoi(req.Cursor)
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "bad cursor %q", req.Cursor)
		}
		next = n + 1
	}
	sent := 0
	for {
		s.mu.Lock()
		evs := tk.events[min(next, len(tk.events)):]
		done := terminal(tk.t.State)
		wake := s.changed
		s.mu.Unlock()
		for _, ev := range evs {
			if sent == cut {
				return status.Error(codes.Unavailable, "sdktest: stream cut")
			}
			if sent == eof {
				return nil
			}
			if err := stream.Send(ev); err != nil {
				return err
			}
			next++
			sent++
		}
		if sent == cut {
			return status.Error(codes.Unavailable, "sdktest: stream cut")
		}
		if done && len(evs) == 0 {
			return nil
		}
		if done {
			continue
		}
		if req.NoWait {
			return nil
		}
		select {
		case <-wake:
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// appendLocked adds an event to the task.
func (s *Server) appendLocked(tk *task, attempt int32, ev any) {
	e := &v1.TaskEvent{Cursor: strconv.Itoa(len(tk.events)), Time: timestamppb.Now(), Attempt: attempt}
	switch x := ev.(type) {
	case *v1.TaskEvent_State:
		e.Event = x
	case *v1.TaskEvent_Log:
		e.Event = x
	}
	tk.events = append(tk.events, e)
	s.broadcastLocked()
}

func (s *Server) get(id string) *task {
	tk, ok := s.tasks[id]
	if !ok {
		panic("sdktest: no task " + id)
	}
	return tk
}

// StartAttempt places the task's next attempt on machine and marks it
// running.
func (s *Server) StartAttempt(id, machine string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tk := s.get(id)
	n := int32(len(tk.t.Attempts) + 1)
	tk.t.Attempts = append(tk.t.Attempts, &v1.Attempt{Number: n, State: v1.AttemptState_ATTEMPT_STATE_RUNNING, MachineId: machine,
		ScheduledAt: timestamppb.Now(), StartedAt: timestamppb.Now()})
	tk.t.State = v1.TaskState_TASK_STATE_RUNNING
	s.appendLocked(tk, n, &v1.TaskEvent_State{State: &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_SCHEDULED,
		AttemptState: v1.AttemptState_ATTEMPT_STATE_SCHEDULED, MachineId: machine, NewAttempt: n > 1}})
	s.appendLocked(tk, n, &v1.TaskEvent_State{State: &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_RUNNING,
		AttemptState: v1.AttemptState_ATTEMPT_STATE_RUNNING, MachineId: machine}})
}

// Log appends output lines of the current attempt.
func (s *Server) Log(id string, stream v1.LogStream, lines ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tk := s.get(id)
	for _, l := range lines {
		s.appendLocked(tk, int32(len(tk.t.Attempts)), &v1.TaskEvent_Log{Log: &v1.LogLine{Stream: stream, Text: l}})
	}
}

// LoseAttempt marks the current attempt lost; the task waits for the next
// (StartAttempt) or, with final, fails.
func (s *Server) LoseAttempt(id, msg string, final bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tk := s.get(id)
	at := tk.t.Attempts[len(tk.t.Attempts)-1]
	at.State, at.Message, at.FinishedAt = v1.AttemptState_ATTEMPT_STATE_LOST, msg, timestamppb.Now()
	if final {
		tk.t.Message = "attempt " + strconv.Itoa(int(at.Number)) + " lost and no retries left"
		s.endLocked(tk, v1.TaskState_TASK_STATE_FAILED, v1.AttemptState_ATTEMPT_STATE_LOST, nil, msg)
		return
	}
	tk.t.State = v1.TaskState_TASK_STATE_PENDING
	s.appendLocked(tk, at.Number, &v1.TaskEvent_State{State: &v1.StateChange{TaskState: v1.TaskState_TASK_STATE_PENDING,
		AttemptState: v1.AttemptState_ATTEMPT_STATE_LOST, MachineId: at.MachineId, Message: msg}})
}

// Finish ends the task in state with an exit code.
func (s *Server) Finish(id string, state v1.TaskState, exitCode int32, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	as := map[v1.TaskState]v1.AttemptState{
		v1.TaskState_TASK_STATE_SUCCEEDED: v1.AttemptState_ATTEMPT_STATE_SUCCEEDED,
		v1.TaskState_TASK_STATE_FAILED:    v1.AttemptState_ATTEMPT_STATE_FAILED,
		v1.TaskState_TASK_STATE_CANCELLED: v1.AttemptState_ATTEMPT_STATE_CANCELLED,
		v1.TaskState_TASK_STATE_TIMED_OUT: v1.AttemptState_ATTEMPT_STATE_TIMED_OUT,
	}[state]
	s.endLocked(s.get(id), state, as, &exitCode, msg)
}

func (s *Server) endLocked(tk *task, state v1.TaskState, as v1.AttemptState, exitCode *int32, msg string) {
	n := int32(len(tk.t.Attempts))
	if n > 0 {
		at := tk.t.Attempts[n-1]
		at.State, at.ExitCode = as, exitCode
		if at.FinishedAt == nil {
			at.FinishedAt = timestamppb.Now()
		}
		if at.Message == "" {
			at.Message = msg
		}
	}
	tk.t.State, tk.t.ExitCode, tk.t.FinishedAt = state, exitCode, timestamppb.Now()
	if tk.t.Message == "" && (exitCode == nil || *exitCode == 0) {
		tk.t.Message = msg
	}
	s.appendLocked(tk, n, &v1.TaskEvent_State{State: &v1.StateChange{TaskState: state, AttemptState: as, ExitCode: exitCode, Message: msg}})
}

// LoseSubmitReplies makes the next n submits answer Unavailable after
// storing the task.
func (s *Server) LoseSubmitReplies(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseReplies = n
}

// CutNext ends the next n follow streams with Unavailable after after
// events each.
func (s *Server) CutNext(n, after int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cuts, s.cutAfter = n, after
}

// EOFNext ends the next n follow streams cleanly after after events each,
// before the terminal event.
func (s *Server) EOFNext(n, after int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.eofs, s.eofAfter = n, after
}

// HoldCancels makes CancelTask leave tasks running (as a real cancel of a
// running task takes a moment); Finish then ends them.
func (s *Server) HoldCancels() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onCancel = func(string) {}
}

// Follows are the cursors follow streams started from, in order.
func (s *Server) Follows() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.follows...)
}

// Cancels are the task IDs CancelTask was called for.
func (s *Server) Cancels() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.cancels...)
}

// Submits counts SubmitTask calls.
func (s *Server) Submits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.submits
}

// GetTaskResult answers as the controlplane does: NotFound for an unknown
// task or one that has not ended, else the result SetResult gave (none
// without).
func (s *Server) GetTaskResult(_ context.Context, req *v1.GetTaskResultRequest) (*v1.GetTaskResultResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tk, ok := s.tasks[req.Id]
	switch {
	case !ok:
		return nil, status.Errorf(codes.NotFound, "no task %s", req.Id)
	case !terminal(tk.t.State):
		return nil, status.Errorf(codes.NotFound, "task %s has not ended (it is %s)", req.Id, tk.t.State)
	case tk.result != nil:
		return proto.Clone(tk.result).(*v1.GetTaskResultResponse), nil
	}
	return &v1.GetTaskResultResponse{Attempt: int32(len(tk.t.Attempts))}, nil
}

// SetResult sets what GetTaskResult answers for a task once it ended.
func (s *Server) SetResult(id string, r *v1.GetTaskResultResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.get(id).result = r
}

// Spec returns the spec a task was submitted with.
func (s *Server) Spec(id string) *v1.TaskSpec {
	s.mu.Lock()
	defer s.mu.Unlock()
	return proto.Clone(s.get(id).t.Spec).(*v1.TaskSpec)
}

// Tasks lists the task IDs, oldest first.
func (s *Server) Tasks() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.order...)
}

// WaitFor polls cond until it holds or 10 seconds pass (testenv.Eventually).
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, cond)
}
