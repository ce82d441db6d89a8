package localstack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
)

// ensureAgent joins this machine to the default pool through the same join
// script a remote box runs, and keeps its agent running in the background.
func ensureAgent(ctx context.Context, p Paths, st *State, say func(string, ...any)) error {
	if pidAlive(p.file("agent.pid")) {
		say("local agent already running")
		return waitOnline(ctx, p, st, say)
	}
	stateDir := p.file("agent/state")
	// The local registry is plain HTTP on loopback.
	agentArgs := []string{"--insecure-registries", fmt.Sprintf("127.0.0.1:%d", st.RegistryPort)}
	var cmd *exec.Cmd
	if _, err := os.Stat(p.file("agent/state/agent.json")); err == nil {
		say("starting the local agent (already joined)")
		cmd = exec.Command(p.Bin+"/levers9-agent", append([]string{"run", "--state-dir", stateDir}, agentArgs...)...)
	} else {
		script, err := createLocalMachine(ctx, p, st)
		if err != nil {
			return err
		}
		say("joining this machine to pool default with the join script %s", script)
		cmd = exec.Command("sh", append([]string{script, "--foreground", "--state-dir", stateDir,
			"--etc-dir", p.file("agent/etc"), "--bin-dir", p.file("agent/bin"), "--"}, agentArgs...)...)
	}
	logf, err := os.OpenFile(p.file("agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the local agent: %w", err)
	}
	if err := os.WriteFile(p.file("agent.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	_ = cmd.Process.Release()
	return waitOnline(ctx, p, st, say)
}

func dialLocal(p Paths, st *State) (*grpc.ClientConn, error) {
	tc, err := tlsConfig(p)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", st.GRPCPort), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
}

func createLocalMachine(ctx context.Context, p Paths, st *State) (string, error) {
	conn, err := dialLocal(p, st)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+st.AdminToken), 60*time.Second)
	defer cancel()
	mc := v1.NewMachineServiceClient(conn)
	resp, err := mc.CreateMachine(cctx, &v1.CreateMachineRequest{Pool: "default", Name: "local"})
	if errdefs.IsAlreadyExists(errdefs.FromGRPC(err)) {
		resp, err = mc.CreateMachine(cctx, &v1.CreateMachineRequest{Pool: "default"})
	}
	if err != nil {
		return "", fmt.Errorf("create the local machine: %w", err)
	}
	st.LocalMachineID = resp.Machine.Id
	if err := st.save(p); err != nil {
		return "", err
	}
	script := p.file("agent/join.sh")
	return script, enroll.WriteSecretFile(script, []byte(resp.JoinScript))
}

func waitOnline(ctx context.Context, p Paths, st *State, say func(string, ...any)) error {
	if st.LocalMachineID == "" {
		return nil
	}
	conn, err := dialLocal(p, st)
	if err != nil {
		return err
	}
	defer conn.Close()
	mc := v1.NewMachineServiceClient(conn)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+st.AdminToken), 5*time.Second)
		resp, err := mc.GetMachine(cctx, &v1.GetMachineRequest{Id: st.LocalMachineID})
		cancel()
		if err == nil && resp.Machine.State == v1.MachineState_MACHINE_STATE_ONLINE {
			say("local agent online: machine %s in pool default over %s", resp.Machine.Id, resp.Machine.Transport)
			return nil
		}
		if !pidAlive(p.file("agent.pid")) {
			return fmt.Errorf("the local agent exited; see %s:\n%s", p.file("agent.log"), tail(p.file("agent.log"), 15))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
	return fmt.Errorf("the local agent did not come online within 60s; see %s", p.file("agent.log"))
}
