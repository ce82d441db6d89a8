package clusteragent

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
)

// The agent acts for its own pool only, and never makes a worker without
// its machine and token; both are refused before the API server is asked
// (the service has no client here, so reaching it would panic).
func TestMakeWorkerRefusals(t *testing.T) {
	t.Parallel()
	s := &service{pool: "gpu", log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		name string
		req  *agentv1.MakeWorkerRequest
		want codes.Code
	}{
		{"another pool", &agentv1.MakeWorkerRequest{Spec: &agentv1.WorkerSpec{Pool: "cpu", MachineId: "m_x"}, JoinToken: "l9j_x"}, codes.PermissionDenied},
		{"no token", &agentv1.MakeWorkerRequest{Spec: &agentv1.WorkerSpec{Pool: "gpu", MachineId: "m_x"}}, codes.InvalidArgument},
		{"no machine", &agentv1.MakeWorkerRequest{Spec: &agentv1.WorkerSpec{Pool: "gpu"}, JoinToken: "l9j_x"}, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.MakeWorker(context.Background(), tc.req)
			if status.Code(err) != tc.want {
				t.Errorf("MakeWorker: %v, want %s", err, tc.want)
			}
		})
	}
}

func TestMerged(t *testing.T) {
	t.Parallel()
	got := merged(map[string]string{"a": "1", "b": "1"}, map[string]string{"b": "2", "c": "2"})
	if len(got) != 3 || got["a"] != "1" || got["b"] != "2" || got["c"] != "2" {
		t.Errorf("merged = %v", got)
	}
	if merged(nil, map[string]string{}) != nil {
		t.Error("merged of nothing is not nil")
	}
}
