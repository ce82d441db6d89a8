package agents_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/controlplane/agents"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/errdefs"
)

const within = 10 * time.Second

// presence reads the presence record of machineID from Redis ("" when
// there is none).
func presence(t *testing.T, b *bundle, machineID string) (replica string, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	raw, err := b.bus.Redis().Get(ctx, bus.PresenceKey(machineID)).Bytes()
	if err != nil {
		return "", 0
	}
	var rec struct{ Replica string }
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatalf("presence record %q: %v", raw, err)
	}
	return rec.Replica, b.bus.Redis().PTTL(ctx, bus.PresenceKey(machineID)).Val()
}

func TestPresence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ttl := 3 * time.Second
	r1, _ := b.replica(t, func(c *agents.Config) { c.PresenceTTL = ttl })
	r2, _ := b.replica(t, nil)
	id, cert := b.machine(t, time.Hour)
	a := connect(t, b, r1, id, cert)

	controlplanetest.Eventually(t, within, "presence claimed by replica 1", func() bool {
		rep, _ := presence(t, b, id)
		return rep == r1.ReplicaID()
	})
	if _, got := presence(t, b, id); got <= 0 || got > ttl {
		t.Errorf("presence TTL %v, want within (0, %v]", got, ttl)
	}
	for name, r := range map[string]*agents.Registry{"holder": r1, "other replica": r2} {
		if tr, online := r.Online(id); !online || tr == "" {
			t.Errorf("%s: Online = %q, %v", name, tr, online)
		}
	}
	if _, online := r2.Online("m_nope"); online {
		t.Error("an unknown machine is online")
	}
	// The holder refreshes its claim: its TTL goes up again between polls.
	var last time.Duration
	controlplanetest.Eventually(t, within, "a refreshed claim", func() bool {
		_, left := presence(t, b, id)
		refreshed := last > 0 && left > last+100*time.Millisecond
		last = left
		return refreshed
	})
	m, err := b.st.MachineByID(context.Background(), id)
	if err != nil || m.LastHeartbeat == nil || m.Transport == "" {
		t.Errorf("connect not recorded: %+v, %v", m, err)
	}

	// The agent leaves: the holder releases its claim.
	a.auto.Stop()
	controlplanetest.Eventually(t, within, "presence released", func() bool {
		rep, _ := presence(t, b, id)
		return rep == ""
	})
	if _, online := r2.Online(id); online {
		t.Error("the other replica still sees the agent online")
	}
}

// TestReleaseKeepsAnotherReplicasClaim: a replica that stops gives up only
// the claims that are still its own.
func TestReleaseKeepsAnotherReplicasClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r1, _ := b.replica(t, nil)
	id, cert := b.machine(t, time.Hour)
	connect(t, b, r1, id, cert)
	controlplanetest.Eventually(t, within, "presence claimed by replica 1", func() bool {
		rep, _ := presence(t, b, id)
		return rep == r1.ReplicaID()
	})
	// Another replica took the agent over meanwhile.
	if err := b.bus.Redis().Set(context.Background(), bus.PresenceKey(id), `{"replica":"rep_newer","transport":"quic"}`, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	r1.Stop()
	if rep, _ := presence(t, b, id); rep != "rep_newer" {
		t.Errorf("presence after replica 1 stopped = %q, want the newer replica's claim kept", rep)
	}
}

func TestForwardBetweenReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r1, _ := b.replica(t, nil)
	r2, _ := b.replica(t, nil)
	id, cert := b.machine(t, time.Hour)
	a := connect(t, b, r1, id, cert)
	controlplanetest.Eventually(t, within, "presence seen by replica 2", func() bool {
		_, online := r2.Online(id)
		return online
	})
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()

	for name, r := range map[string]*agents.Registry{"local": r1, "forwarded": r2} {
		conn, err := r.Conn(ctx, id)
		if err != nil {
			t.Fatalf("%s: Conn: %v", name, err)
		}
		pong, err := agentv1.NewAgentClient(conn).Ping(ctx, &agentv1.PingRequest{Payload: []byte(name)})
		if err != nil || pong.MachineId != id || string(pong.Payload) != name {
			t.Errorf("%s ping = %v, %v", name, pong, err)
		}
	}

	t.Run("an error crosses replicas with its code", func(t *testing.T) {
		conn, err := r2.Conn(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		_, err = agentv1.NewAgentClient(conn).RunTask(ctx, &agentv1.RunTaskRequest{})
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("forwarded RunTask on an agent without it: %v, want Unimplemented", err)
		}
		// ClusterAgent calls cross too (an attached cluster's agent); this
		// agent does not serve it, so the agent itself says Unimplemented.
		_, err = agentv1.NewClusterAgentClient(conn).ListWorkers(ctx, &agentv1.ListWorkersRequest{})
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("forwarded ListWorkers on an agent without it: %v, want Unimplemented", err)
		}
		// Only what the controlplane pushes to agents is forwarded.
		err = conn.Invoke(ctx, "/levers9.agent.v1.Controlplane/Heartbeat", &agentv1.HeartbeatRequest{}, &agentv1.HeartbeatResponse{})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("forwarded Controlplane call: %v, want PermissionDenied", err)
		}
		_, err = conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/levers9.agent.v1.Agent/Anything")
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("forwarded stream: %v, want Unimplemented", err)
		}
	})
	t.Run("offline and gone holders", func(t *testing.T) {
		if _, err := r2.Conn(ctx, "m_nope"); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("Conn to a machine nobody holds: %v, want unavailable", err)
		}
		ghost, _ := b.machine(t, time.Hour)
		if err := b.bus.Redis().Set(ctx, bus.PresenceKey(ghost), r2.SignedPresenceForTest(ghost, "rep_gone", "quic"), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		conn, err := r2.Conn(ctx, ghost)
		if err != nil {
			t.Fatal(err)
		}
		_, err = agentv1.NewAgentClient(conn).Ping(ctx, &agentv1.PingRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("ping through a replica that is gone: %v, want Unavailable", err)
		}
		// A live replica that no longer holds the machine says so with
		// Unavailable (the push is sent again), not Unknown (lost at once).
		stale, _ := b.machine(t, time.Hour)
		if err := b.bus.Redis().Set(ctx, bus.PresenceKey(stale), r2.SignedPresenceForTest(stale, r1.ReplicaID(), "quic"), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if conn, err = r2.Conn(ctx, stale); err != nil {
			t.Fatal(err)
		}
		_, err = agentv1.NewAgentClient(conn).Ping(ctx, &agentv1.PingRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("ping through a replica that does not hold the machine: %v, want Unavailable", err)
		}
	})
	t.Run("drop through the other replica", func(t *testing.T) {
		before := a.sessionCount()
		r2.Drop(id)
		controlplanetest.Eventually(t, within, "the agent reconnects after the drop", func() bool { return a.sessionCount() > before })
	})
}

// TestRefusedCertificates: a deleted machine's certificate gets no tunnel.
func TestRefusedCertificates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, logs := b.replica(t, nil)
	id, cert := b.machine(t, time.Hour)
	if _, err := b.st.DeleteMachine(context.Background(), b.ws.ID, id); err != nil {
		t.Fatal(err)
	}
	a := connect(t, b, r, id, cert)
	controlplanetest.Eventually(t, within, "two refused tunnels", func() bool { return len(logs.Find("tunnel refused: machine deleted")) >= 2 })
	if _, online := r.Online(id); online || a.sessionCount() != 0 {
		t.Errorf("a deleted machine is online (%d sessions)", a.sessionCount())
	}
	if rep, _ := presence(t, b, id); rep != "" {
		t.Errorf("a deleted machine has a presence claim on %s", rep)
	}
}
