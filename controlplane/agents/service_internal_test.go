package agents

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/tunnel"
)

// TestCallerCheck: every agent RPC refuses a caller that did not come over
// an agent tunnel, before it touches anything (the service has no
// registry here, so reaching past the check would panic).
func TestCallerCheck(t *testing.T) {
	t.Parallel()
	s := &controlplaneService{}
	for name, ctx := range map[string]context.Context{
		"no peer":          context.Background(),
		"a plain TCP peer": peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}}),
		"no identity":      peer.NewContext(context.Background(), &peer.Peer{Addr: &tunnel.Addr{Transport: "quic"}}),
	} {
		for rpc, call := range map[string]func() error{
			"Heartbeat": func() error { _, err := s.Heartbeat(ctx, &agentv1.HeartbeatRequest{}); return err },
			"RenewCertificate": func() error {
				_, err := s.RenewCertificate(ctx, &agentv1.RenewCertificateRequest{})
				return err
			},
			"ReportAttempt": func() error { _, err := s.ReportAttempt(ctx, &agentv1.ReportAttemptRequest{}); return err },
		} {
			if err := call(); status.Code(err) != codes.Unauthenticated {
				t.Errorf("%s from %s: %v, want Unauthenticated", rpc, name, err)
			}
		}
	}
}
