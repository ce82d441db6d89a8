package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/tunnel"
)

// newMachineToken creates a machine in pool default and writes its join
// token to a file beside an empty state directory.
func newMachineToken(t *testing.T, b *joinBundle) (machineID, tokenFile string, state State) {
	t.Helper()
	created, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile = filepath.Join(dir, "join-token")
	if err := os.WriteFile(tokenFile, []byte(created.JoinToken), 0o600); err != nil {
		t.Fatal(err)
	}
	return created.Machine.Id, tokenFile, State{Dir: filepath.Join(dir, "state")}
}

// TestJoinRefusesWrongCA: an agent told to trust another CA than the one
// that signed the controlplane's certificate does not enroll, and sends
// nothing: the join token is still unused afterwards. Without a CA file it
// trusts only the system roots, which do not hold the self-signed test CA.
func TestJoinRefusesWrongCA(t *testing.T) {
	t.Parallel()
	b := setupJoin(t)
	_, tokenFile, state := newMachineToken(t, b)
	otherCA, _ := controlplanetest.SelfSignedTLS(t)
	for _, ca := range []string{otherCA, ""} {
		_, err := Join(context.Background(), JoinOptions{Controlplane: b.in.Server.GRPCAddr(), CAFile: ca, TokenFile: tokenFile, State: state, Hostname: "box"})
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("join trusting %q: err = %v, want a certificate error", ca, err)
		}
		if state.Joined("") {
			t.Fatalf("join trusting %q left a credential", ca)
		}
	}
	if len(b.in.Logs.Find("enrolled")) != 0 {
		t.Error("the controlplane enrolled a machine over an unverified connection")
	}
	// The token was never sent: the right CA still enrolls with it.
	if _, err := Join(context.Background(), JoinOptions{Controlplane: b.in.Server.GRPCAddr(), CAFile: b.caFile, TokenFile: tokenFile, State: state, Hostname: "box"}); err != nil {
		t.Fatalf("join with the right CA after the refusals: %v", err)
	}
}

// TestTunnelRefusesWrongCA: an enrolled agent whose agent-ca.pem is not the
// CA of the controlplane's tunnel certificate never brings its tunnel up,
// although its own certificate would be accepted: the agent checks the
// controlplane, not only the other way round.
func TestTunnelRefusesWrongCA(t *testing.T) {
	t.Parallel()
	b := setupJoin(t)
	machineID, tokenFile, state := newMachineToken(t, b)
	if _, err := Join(context.Background(), JoinOptions{Controlplane: b.in.Server.GRPCAddr(), CAFile: b.caFile, TokenFile: tokenFile, State: state}); err != nil {
		t.Fatal(err)
	}
	_, foreignPEM, _, err := enroll.NewCA("not the levers9 agents CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := enroll.WriteSecretFile(state.path("agent-ca.pem"), foreignPEM); err != nil {
		t.Fatal(err)
	}
	a, err := NewAgent(RunOptions{State: state, Version: "t", HeartbeatInterval: 200 * time.Millisecond, Log: slog.New(slog.DiscardHandler),
		Client: tunnel.ClientConfig{BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if _, online := b.in.Server.Agents().Online(machineID); online {
			t.Fatal("the agent brought its tunnel up to a controlplane whose certificate its CA did not sign")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
