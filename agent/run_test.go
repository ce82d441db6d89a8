package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/tunnel"
)

// joinedAgent creates a machine, joins it and starts its agent.
func joinedAgent(t *testing.T, b *joinBundle) *Agent {
	t.Helper()
	return startJoinedAgent(t, b, RunOptions{Version: "t", HeartbeatInterval: 500 * time.Millisecond})
}

// startJoinedAgent creates a machine in pool default, joins it with o's
// version into a fresh state directory and starts an agent with o (State,
// Log and a fast-reconnecting Client filled in), stopped in t.Cleanup.
func startJoinedAgent(t *testing.T, b *joinBundle, o RunOptions) *Agent {
	t.Helper()
	created, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(created.JoinToken), 0o600)
	o.State = State{Dir: filepath.Join(dir, "state")}
	if _, err := Join(context.Background(), JoinOptions{Controlplane: b.in.Server.GRPCAddr(), CAFile: b.caFile, TokenFile: tokenFile, State: o.State, Version: o.Version}); err != nil {
		t.Fatal(err)
	}
	o.Log = slog.New(slog.DiscardHandler)
	o.Client = tunnel.ClientConfig{BackoffBase: 100 * time.Millisecond, BackoffMax: 500 * time.Millisecond}
	return startedAgent(t, o)
}

// startedAgent makes an agent with o and starts it, stopped in t.Cleanup.
func startedAgent(t *testing.T, o RunOptions) *Agent {
	t.Helper()
	a, err := NewAgent(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	return a
}

func TestAgentOnlineWithInventoryAndPush(t *testing.T) {
	t.Parallel()
	b := setupJoin(t)
	a := joinedAgent(t, b)
	var m *v1.Machine
	controlplanetest.Eventually(t, 30*time.Second, "machine online with inventory", func() bool {
		resp, err := b.machines.GetMachine(b.ctx, &v1.GetMachineRequest{Id: a.MachineID()})
		if err != nil {
			return false
		}
		m = resp.Machine
		return m.State == v1.MachineState_MACHINE_STATE_ONLINE && m.GetInventory().GetCpus() > 0
	})
	if m.Transport != "quic" && m.Transport != "tcp" {
		t.Errorf("transport %q", m.Transport)
	}
	if m.Inventory.RuncVersion == "" || m.Inventory.Kernel == "" {
		t.Errorf("inventory = %+v", m.Inventory)
	}
	conn, err := b.in.Server.Agents().Conn(context.Background(), a.MachineID())
	if err != nil {
		t.Fatal(err)
	}
	pong, err := agentv1.NewAgentClient(conn).Ping(context.Background(), &agentv1.PingRequest{Payload: []byte("hi")})
	if err != nil || pong.MachineId != a.MachineID() || string(pong.Payload) != "hi" {
		t.Fatalf("push: %v %v", pong, err)
	}

	// Delete: offline within 2 s, and the certificate no longer connects.
	if _, err := b.machines.DeleteMachine(b.ctx, &v1.DeleteMachineRequest{Id: a.MachineID()}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	controlplanetest.Eventually(t, 2*time.Second, "tunnel dropped after delete", func() bool {
		_, online := b.in.Server.Agents().Online(a.MachineID())
		return !online
	})
	t.Logf("offline %v after delete", time.Since(start))
	// The agent tries to come back (every 0.5 s at most): wait for two
	// refusals rather than sleeping.
	controlplanetest.Eventually(t, 10*time.Second, "the agent refused twice after the delete", func() bool {
		return len(b.in.Logs.Find("tunnel refused: machine deleted")) >= 2
	})
	if _, online := b.in.Server.Agents().Online(a.MachineID()); online {
		t.Error("a deleted machine's certificate connected again")
	}
	if len(b.in.Logs.Find("tunnel refused: machine deleted")) == 0 {
		t.Error("no audit line for the refused tunnel")
	}
}

// TestPushThroughAnotherReplica runs two controlplanes on one database and
// one Redis: a push through the replica that does not hold the agent's
// tunnel is forwarded to the one that does.
func TestPushThroughAnotherReplica(t *testing.T) {
	t.Parallel()
	b := setupJoin(t)
	a := joinedAgent(t, b)
	controlplanetest.Eventually(t, 10*time.Second, "agent connected to replica 1", func() bool {
		_, err := b.in.Server.Agents().Conn(context.Background(), a.MachineID())
		return err == nil
	})
	cfg2 := *b.in.Config
	cfg2.Controlplane = b.in.Config.Controlplane
	port, _ := devstack.FreeTCPUDPPort()
	cfg2.Controlplane.GRPCAddr, cfg2.Controlplane.RESTAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg2.Controlplane.TunnelAddr = fmt.Sprintf("127.0.0.1:%d", port)
	in2 := controlplanetest.Start(t, &cfg2, true)
	controlplanetest.Eventually(t, 10*time.Second, "replica 2's tunnel endpoint", func() bool { return in2.Server.Agents() != nil })
	if _, err := in2.Server.Agents().Conn(context.Background(), "m_nope"); err == nil {
		t.Error("an unknown machine has a connection")
	}
	conn, err := in2.Server.Agents().Conn(context.Background(), a.MachineID())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pong, err := agentv1.NewAgentClient(conn).Ping(ctx, &agentv1.PingRequest{Payload: []byte("via replica 2")})
	if err != nil || pong.MachineId != a.MachineID() || string(pong.Payload) != "via replica 2" {
		t.Fatalf("forwarded push: %v %v", pong, err)
	}
	if tr, online := in2.Server.Agents().Online(a.MachineID()); !online || tr == "" {
		t.Error("replica 2 does not see the agent online")
	}
}
