package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

var env *controlplanetest.Env

func TestMain(m *testing.M) {
	os.Exit(controlplanetest.Main(m, &env))
}

type joinBundle struct {
	in       *controlplanetest.Instance
	machines v1.MachineServiceClient
	ctx      context.Context
	caFile   string
}

func setupJoin(t *testing.T) *joinBundle {
	t.Helper()
	return setupJoinWith(t, nil)
}

// setupJoinWith is setupJoin with mutate applied to the config first.
func setupJoinWith(t *testing.T, mutate func(*config.Config)) *joinBundle {
	t.Helper()
	cert, key := controlplanetest.SelfSignedTLS(t)
	cfg := env.Config(t)
	if mutate != nil {
		mutate(cfg)
	}
	cfg.Controlplane.TLS.CertFile, cfg.Controlplane.TLS.KeyFile = cert, key
	cfg.Controlplane.AgentBinariesDir = t.TempDir()
	if err := os.WriteFile(filepath.Join(cfg.Controlplane.AgentBinariesDir, "levers9-agent-linux-amd64"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	in := controlplanetest.Start(t, cfg, true)
	resp, err := v1.NewAuthServiceClient(in.Conn).Authorize(
		metadata.AppendToOutgoingContext(context.Background(), "x-levers9-bootstrap-secret", "test-bootstrap-secret-0123456789abcdef"), &v1.AuthorizeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return &joinBundle{in: in, machines: v1.NewMachineServiceClient(in.Conn), caFile: cert,
		ctx: metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+resp.Token)}
}

func TestJoin(t *testing.T) {
	t.Parallel()
	b := setupJoin(t)
	created, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "join-token")
	if err := os.WriteFile(tokenFile, []byte(created.JoinToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := State{Dir: filepath.Join(dir, "state")}
	opts := JoinOptions{Controlplane: b.in.Server.GRPCAddr(), CAFile: b.caFile, TokenFile: tokenFile, State: state, Version: "test", Hostname: "box"}
	st, err := Join(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if st.MachineID != created.Machine.Id || st.Pool != "default" || len(st.TunnelAddrs) != 1 || !st.ControlplaneCA {
		t.Errorf("settings = %+v", st)
	}
	if _, err := os.Stat(tokenFile); !os.IsNotExist(err) {
		t.Error("the used token file is still there")
	}
	for _, name := range []string{"agent.key", "agent.crt", "agent-ca.pem", "machine-id", "agent.json", "controlplane-ca.pem"} {
		fi, err := os.Stat(filepath.Join(state.Dir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", name, fi, err)
		}
	}
	// Joining again is harmless: no token needed, same machine.
	again, err := Join(context.Background(), opts)
	if err != nil || again.MachineID != st.MachineID {
		t.Errorf("second join: %+v %v", again, err)
	}
	m, err := b.machines.GetMachine(b.ctx, &v1.GetMachineRequest{Id: st.MachineID})
	if err != nil || m.Machine.EnrolledAt == nil || m.Machine.AgentVersion != "test" {
		t.Errorf("machine after join: %v %v", m, err)
	}
}

func TestJoinRefusedKeepsNoCredential(t *testing.T) {
	t.Parallel()
	b := setupJoin(t)
	created, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.machines.DeleteMachine(b.ctx, &v1.DeleteMachineRequest{Id: created.Machine.Id}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "join-token")
	os.WriteFile(tokenFile, []byte(created.JoinToken), 0o600)
	state := State{Dir: filepath.Join(dir, "state")}
	_, err = Join(context.Background(), JoinOptions{Controlplane: b.in.Server.GRPCAddr(), CAFile: b.caFile, TokenFile: tokenFile, State: state})
	if err == nil || !strings.Contains(err.Error(), "refused") || strings.Contains(err.Error(), created.JoinToken) {
		t.Fatalf("join of a deleted machine: %v", err)
	}
	if state.Joined("") {
		t.Error("a refused join left a credential")
	}
	// Garbage in the token file is refused before anything is sent.
	os.WriteFile(tokenFile, []byte("garbage"), 0o600)
	if _, err := Join(context.Background(), JoinOptions{Controlplane: "127.0.0.1:1", TokenFile: tokenFile, State: state}); err == nil || !strings.Contains(err.Error(), "join token") {
		t.Errorf("garbage token: %v", err)
	}
}
