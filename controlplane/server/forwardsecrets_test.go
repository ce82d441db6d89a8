package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// revealed reports whether raw, a message read from Redis, holds secret:
// in clear, or in any string of its JSON once base64-decoded (how JSON
// carries bytes).
func revealed(raw []byte, secret string) bool {
	if bytes.Contains(raw, []byte(secret)) {
		return true
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	var walk func(v any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case string:
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
				if b, err := enc.DecodeString(v); err == nil && bytes.Contains(b, []byte(secret)) {
					return true
				}
			}
		case map[string]any:
			for _, e := range v {
				if walk(e) {
					return true
				}
			}
		case []any:
			for _, e := range v {
				if walk(e) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// TestForwardedPushesHideSecrets is the attack of someone who can
// SUBSCRIBE on the controlplane's Redis (a leaked Redis password, a task
// that reaches it): while a replica that does not hold a machine's tunnel
// pushes it tasks carrying a workspace secret and a registry login, a
// subscriber to every replica channel records what passes. Neither the
// secret's value nor the registry password appears in anything it heard,
// and the agent still receives both.
func TestForwardedPushesHideSecrets(t *testing.T) {
	t.Parallel()
	const (
		secretValue = "s3cr3t-db-password-7f1c0ffee"
		registryPwd = "registry-token-9a8b7c6d5e4f"
		registryHst = "reg.fwd.example:5000"
	)
	b := setupMachines(t, func(c *config.Config) { c.Worker.DefaultImage = "busybox:test" })
	holder := b.in
	other := secondReplica(t, holder)
	m := controlplanetest.StartScriptedMachine(t, holder, b.ctx, "default", 4, 0)
	holderChannel := bus.ReplicaChannel(holder.Server.Agents().ReplicaID())
	// The eavesdropper: every replica channel.
	rdb := redisOf(t, holder)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tap := rdb.PSubscribe(ctx, bus.ReplicaChannel("*"))
	t.Cleanup(func() { tap.Close() })
	if _, err := tap.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		heard    [][]byte
		runCalls int // forwarded RunTask calls on the holder's channel
		replies  int // replies to forwarded calls
	)
	go func() {
		for msg := range tap.Channel() {
			mu.Lock()
			heard = append(heard, []byte(msg.Payload))
			if msg.Channel == holderChannel && strings.Contains(msg.Payload, `"kind":"call"`) && strings.Contains(msg.Payload, "/RunTask") {
				runCalls++
			}
			if strings.Contains(msg.Payload, `"kind":"reply"`) {
				replies++
			}
			mu.Unlock()
		}
	}()
	forwarded := func() int {
		mu.Lock()
		defer mu.Unlock()
		return runCalls
	}

	if _, err := v1.NewSecretServiceClient(other.Conn).PutSecret(b.ctx, &v1.PutSecretRequest{Name: "db",
		Values: map[string]string{"DB_PASSWORD": secretValue}}); err != nil {
		t.Fatal(err)
	}
	if _, err := v1.NewRegistryServiceClient(other.Conn).LoginRegistry(b.ctx, &v1.LoginRegistryRequest{Host: registryHst,
		Username: "ci", Password: registryPwd}); err != nil {
		t.Fatal(err)
	}

	// Tasks submitted to the replica without the tunnel: whichever replica
	// schedules the pool pushes them, so submit until one was forwarded.
	tasks := v1.NewTaskServiceClient(other.Conn)
	var got *agentv1.TaskAttempt
	for i := 0; i < 10 && got == nil; i++ {
		before := forwarded()
		resp, err := tasks.SubmitTask(b.ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Image: registryHst + "/app:1",
			Command: []string{"sh", "-c", "echo $DB_PASSWORD"}, Secrets: []string{"db"}}})
		if err != nil {
			t.Fatal(err)
		}
		var ta *agentv1.TaskAttempt
		controlplanetest.Eventually(t, 20*time.Second, "the task on the agent", func() bool {
			for _, a := range m.Attempts() {
				if a.TaskId == resp.Task.Id {
					ta = a
					return true
				}
			}
			return false
		})
		deadline := time.Now().Add(time.Second)
		for forwarded() == before && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if forwarded() > before {
			got = ta
		}
	}
	if got == nil {
		t.Fatal("no push was forwarded from the replica without the tunnel in 10 tasks")
	}
	// And one push straight through the other replica's forwarding.
	conn, err := other.Server.Agents().Conn(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agentv1.NewAgentClient(conn).RunTask(ctx, &agentv1.RunTaskRequest{Attempt: &agentv1.TaskAttempt{TaskId: "t_direct", Attempt: 1,
		Command: []string{"true"}, SecretEnv: []string{"DB_PASSWORD=" + secretValue},
		RegistryAuth: &agentv1.RegistryAuth{Host: registryHst, Username: "ci", Password: registryPwd}}}); err != nil {
		t.Fatalf("a forwarded push: %v", err)
	}

	// The agent got the values.
	if !slices.Contains(got.GetSecretEnv(), "DB_PASSWORD="+secretValue) {
		t.Errorf("the agent got %d secret variables, want DB_PASSWORD with the secret's value", len(got.GetSecretEnv()))
	}
	if got.GetRegistryAuth().GetPassword() != registryPwd || got.GetRegistryAuth().GetHost() != registryHst {
		t.Errorf("the agent got no registry login for %s", registryHst)
	}
	var direct *agentv1.TaskAttempt
	for _, a := range m.Attempts() {
		if a.TaskId == "t_direct" {
			direct = a
		}
	}
	if !slices.Contains(direct.GetSecretEnv(), "DB_PASSWORD="+secretValue) || direct.GetRegistryAuth().GetPassword() != registryPwd {
		t.Errorf("the directly forwarded push arrived without its secrets")
	}

	// Nothing the eavesdropper heard holds either value.
	controlplanetest.Eventually(t, 5*time.Second, "the tap hears every reply", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return replies >= runCalls
	})
	mu.Lock()
	defer mu.Unlock()
	if len(heard) == 0 {
		t.Fatal("the tap heard nothing on the replica channels")
	}
	for _, raw := range heard {
		for what, v := range map[string]string{"the secret's value": secretValue, "the registry password": registryPwd} {
			if revealed(raw, v) {
				t.Errorf("%s is readable on a replica channel: %.200s", what, raw)
			}
		}
	}
	t.Logf("heard %d messages, %d forwarded RunTask calls and %d replies", len(heard), runCalls, replies)
}
