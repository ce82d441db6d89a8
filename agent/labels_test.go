package agent

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/tunnel"
)

// joinLabelled creates a machine in pool with labels and joins it into a
// fresh state directory.
func joinLabelled(t *testing.T, b *joinBundle, pool string, labels map[string]string) (State, Settings, error) {
	t.Helper()
	created, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: pool, Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(created.JoinToken), 0o600); err != nil {
		t.Fatal(err)
	}
	state := State{Dir: filepath.Join(dir, "state")}
	st, err := Join(context.Background(), JoinOptions{Controlplane: b.in.Server.GRPCAddr(), CAFile: b.caFile, TokenFile: tokenFile, State: state, Version: "t"})
	return state, st, err
}

// TestLabelsReachTheInventory: a machine created with labels in a pool
// whose nodeSelector they match joins, keeps them in its state, and its
// agent reports them in the inventory the controlplane shows; a machine
// without the selected label is refused at join with a sentence naming the
// pool and the label, and keeps no credential.
func TestLabelsReachTheInventory(t *testing.T) {
	t.Parallel()
	b := setupJoinWith(t, func(c *config.Config) {
		c.Worker.Pools["eu"] = config.Pool{Runtime: "runc", NodeSelector: map[string]string{"zone": "eu"}}
	})
	labels := map[string]string{"zone": "eu", "example.com/disk": "nvme"}
	state, st, err := joinLabelled(t, b, "eu", labels)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(st.Labels, labels) {
		t.Errorf("settings labels %v, want %v", st.Labels, labels)
	}
	startedAgent(t, RunOptions{State: state, Version: "t", HeartbeatInterval: 500 * time.Millisecond, Log: slog.New(slog.DiscardHandler),
		Client: tunnel.ClientConfig{BackoffBase: 100 * time.Millisecond, BackoffMax: 500 * time.Millisecond}})
	controlplanetest.Eventually(t, 10*time.Second, "the inventory with the machine's labels", func() bool {
		resp, err := b.machines.GetMachine(b.ctx, &v1.GetMachineRequest{Id: st.MachineID})
		return err == nil && maps.Equal(resp.Machine.GetInventory().GetLabels(), labels) && maps.Equal(resp.Machine.Labels, labels)
	})

	state, _, err = joinLabelled(t, b, "eu", map[string]string{"zone": "us"})
	if err == nil || !strings.Contains(err.Error(), `pool "eu"`) || !strings.Contains(err.Error(), "zone=eu") || !strings.Contains(err.Error(), "refused") {
		t.Errorf("join with zone=us into a pool selecting zone=eu: %v", err)
	}
	if state.Joined("") {
		t.Error("a refused join left a credential")
	}
}
