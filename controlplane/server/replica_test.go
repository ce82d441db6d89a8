package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/devstack"
)

// rejectedReplicaMessages sums levers9_replica_messages_rejected_total over
// its reasons, read from the replica's /metrics.
func rejectedReplicaMessages(t *testing.T, in *controlplanetest.Instance) float64 {
	t.Helper()
	resp, err := http.Get("http://" + in.Server.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "levers9_replica_messages_rejected_total{") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// secondReplica starts another replica on in's Postgres and Redis, and
// waits for both tunnel endpoints.
func secondReplica(t *testing.T, in *controlplanetest.Instance) *controlplanetest.Instance {
	t.Helper()
	cfg2 := *in.Config
	cfg2.Controlplane.GRPCAddr, cfg2.Controlplane.RESTAddr = "127.0.0.1:0", "127.0.0.1:0"
	port, err := devstack.FreeTCPUDPPort()
	if err != nil {
		t.Fatal(err)
	}
	cfg2.Controlplane.TunnelAddr = fmt.Sprintf("127.0.0.1:%d", port)
	other := controlplanetest.Start(t, &cfg2, true)
	controlplanetest.Eventually(t, 30*time.Second, "both tunnel endpoints", func() bool {
		return in.Server.Agents() != nil && other.Server.Agents() != nil
	})
	return other
}

// redisOf is a client of in's Redis, as an attacker who has its password.
func redisOf(t *testing.T, in *controlplanetest.Instance) *redis.Client {
	t.Helper()
	rc := in.Config.Database.Redis
	rdb := redis.NewClient(&redis.Options{Addr: rc.Addr, Password: rc.Password, DB: rc.DB})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// TestForgedReplicaMessages is the attack of someone who can write to
// Redis (a task that reaches it, a leaked password) and forges what the
// replicas tell each other: a forwarded RunTask call on the channel of the
// replica holding a machine's tunnel, and a presence record diverting the
// machine to a replica of the attacker's. Nothing runs on the agent,
// nothing reaches the fake replica, real pushes still arrive, and both
// replicas count what they rejected.
func TestForgedReplicaMessages(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, func(c *config.Config) { c.Worker.DefaultImage = "busybox:test" })
	holder := b.in
	other := secondReplica(t, holder)
	m := controlplanetest.StartScriptedMachine(t, holder, b.ctx, "default", 2, 0)
	rdb := redisOf(t, holder)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The attacker listens on a replica channel of its own for answers and
	// diverted calls.
	const fake = "rep_attacker"
	sub := rdb.Subscribe(ctx, bus.ReplicaChannel(fake))
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	received := sub.Channel()
	drain := func(what string, d time.Duration) {
		t.Helper()
		deadline := time.After(d)
		for {
			select {
			case msg := <-received:
				t.Errorf("%s: the attacker's channel received %s", what, msg.Payload)
			case <-deadline:
				return
			}
		}
	}
	runTask := func(taskID string) []byte {
		b, err := proto.Marshal(&agentv1.RunTaskRequest{Attempt: &agentv1.TaskAttempt{TaskId: taskID, Attempt: 1, Command: []string{"echo", "pwned"}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	t.Run("a forged RunTask call", func(t *testing.T) {
		before := rejectedReplicaMessages(t, holder)
		for i, extra := range []map[string]any{
			{}, // no MAC at all
			{"ts": time.Now().UnixMilli(), "nonce": "AAAAAAAAAAAAAAAAAAAAAA", "mac": "bm90IGEgbWFj"}, // a made-up one
		} {
			msg := map[string]any{"kind": "call", "id": fmt.Sprintf("fwd_forged%d", i), "from": fake, "machine": m.ID,
				"method": "/levers9.agent.v1.Agent/RunTask", "payload": runTask(fmt.Sprintf("t_forged%d", i)), "timeoutMs": 5000}
			for k, v := range extra {
				msg[k] = v
			}
			raw, _ := json.Marshal(msg)
			if err := rdb.Publish(ctx, bus.ReplicaChannel(holder.Server.Agents().ReplicaID()), raw).Err(); err != nil {
				t.Fatal(err)
			}
		}
		controlplanetest.Eventually(t, 10*time.Second, "the forged calls run or are rejected", func() bool {
			return len(m.Started()) > 0 || rejectedReplicaMessages(t, holder) >= before+2
		})
		drain("forged call", 500*time.Millisecond)
		if got := m.Started(); len(got) > 0 {
			t.Errorf("a forged RunTask ran on the agent: %v", got)
		}
	})

	t.Run("a forged presence record", func(t *testing.T) {
		before := rejectedReplicaMessages(t, other)
		rec, _ := json.Marshal(map[string]any{"replica": fake, "transport": "quic", "ts": time.Now().UnixMilli(),
			"nonce": "AAAAAAAAAAAAAAAAAAAAAA", "mac": "bm90IGEgbWFj"})
		if err := rdb.Set(ctx, bus.PresenceKey(m.ID), rec, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		// A push through the replica that does not hold the tunnel.
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := other.Server.Agents().Conn(pctx, m.ID)
		if err == nil {
			_, err = agentv1.NewAgentClient(conn).RunTask(pctx, &agentv1.RunTaskRequest{Attempt: &agentv1.TaskAttempt{TaskId: "t_diverted", Attempt: 1, Command: []string{"echo"}}})
		}
		pcancel()
		t.Logf("push while the record is forged: %v", err)
		drain("push through the other replica", time.Second)
		if r := rejectedReplicaMessages(t, other); r <= before {
			t.Errorf("the forged presence record was not counted (%v rejected before and after)", r)
		}
		// Real pushes still reach the agent: a task submitted now, and a
		// push through the other replica once the holder has renewed its
		// claim.
		task, err := v1.NewTaskServiceClient(other.Conn).SubmitTask(b.ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: []string{"echo", "real"}}})
		if err != nil {
			t.Fatal(err)
		}
		controlplanetest.Eventually(t, 20*time.Second, "the submitted task on the agent", func() bool {
			return slices.Contains(m.Started(), task.Task.Id+"/1")
		})
		// The attacker also listens on the holder's channel, to replay what
		// it hears.
		tap := rdb.Subscribe(ctx, bus.ReplicaChannel(holder.Server.Agents().ReplicaID()))
		t.Cleanup(func() { tap.Close() })
		if _, err := tap.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		heard := tap.Channel()
		controlplanetest.Eventually(t, 20*time.Second, "a push through the other replica", func() bool {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			defer pcancel()
			conn, err := other.Server.Agents().Conn(pctx, m.ID)
			if err != nil {
				return false
			}
			_, err = agentv1.NewAgentClient(conn).RunTask(pctx, &agentv1.RunTaskRequest{Attempt: &agentv1.TaskAttempt{TaskId: "t_real", Attempt: 1, Command: []string{"echo"}}})
			return err == nil && slices.Contains(m.Started(), "t_real/1")
		})
		drain("after the claim was renewed", 200*time.Millisecond)

		// Replaying the genuine forwarded RunTask runs nothing again.
		var call []byte
		for call == nil {
			select {
			case msg := <-heard:
				if strings.Contains(msg.Payload, `"kind":"call"`) && strings.Contains(msg.Payload, "RunTask") {
					call = []byte(msg.Payload)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("heard no forwarded RunTask on the holder's channel")
			}
		}
		before = rejectedReplicaMessages(t, holder)
		if err := rdb.Publish(ctx, bus.ReplicaChannel(holder.Server.Agents().ReplicaID()), call).Err(); err != nil {
			t.Fatal(err)
		}
		controlplanetest.Eventually(t, 10*time.Second, "the replay rejected", func() bool { return rejectedReplicaMessages(t, holder) > before })
		runs := 0
		for _, k := range m.Started() {
			if k == "t_real/1" {
				runs++
			}
		}
		if runs != 1 {
			t.Errorf("the pushed attempt started %d times, want once", runs)
		}
	})
}
