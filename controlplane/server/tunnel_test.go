package server_test

import (
	"net"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// TestTunnelEndpointRetries holds the tunnel port when the controlplane
// starts: it serves everything else, logs why, and starts the endpoint once
// the port is free.
func TestTunnelEndpointRetries(t *testing.T) {
	t.Parallel()
	cfg := env.Config(t)
	held, err := net.Listen("tcp", cfg.Controlplane.TunnelAddr)
	if err != nil {
		t.Fatal(err)
	}
	in := controlplanetest.Start(t, cfg, true)
	controlplanetest.Eventually(t, 10*time.Second, "a log line about the tunnel endpoint", func() bool {
		return len(in.Logs.Find("the agent tunnel endpoint did not start")) > 0
	})
	if in.Server.Agents() != nil {
		t.Fatal("tunnel endpoint claims to run on a taken port")
	}
	bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
	held.Close()
	controlplanetest.Eventually(t, 10*time.Second, "tunnel endpoint after the port is free", func() bool { return in.Server.Agents() != nil })
}
