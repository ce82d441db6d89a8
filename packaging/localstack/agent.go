package localstack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
)

// localAgent is one agent of the local stack: the default pool's keeps
// the paths it always had (.levers9-dev/agent/, agent.pid, agent.log);
// every other declared pool gets .levers9-dev/agent-POOL/, agent-POOL.pid
// and agent-POOL.log, and container subnets of its own so its bridge does
// not clash with the others (a machine belongs to exactly one pool, so
// one agent per pool). Each agent claims its subnets and NFLOG group from
// the host allocator (egress.ClaimHost), so two checkouts never clash
// either; Down releases them.
type localAgent struct {
	pool string
	dir  string // state, etc, bin and join.sh below it
	pid  string
	log  string
	// args go to `levers9-agent run` beside the registry flag.
	args []string
}

func (p Paths) agentFor(pool string, slot int) localAgent {
	if pool == "default" {
		return localAgent{pool: pool, dir: p.file("agent"), pid: p.file("agent.pid"), log: p.file("agent.log")}
	}
	return localAgent{pool: pool, dir: p.file("agent-" + pool), pid: p.file("agent-" + pool + ".pid"), log: p.file("agent-" + pool + ".log")}
}

// withWeed adds --weed when weed is not "".
func (a localAgent) withWeed(weed string) localAgent {
	if weed != "" {
		a.args = append(slices.Clip(a.args), "--weed", weed)
	}
	return a
}

// argsFile keeps the flags the running agent was started with, so a
// change (volumes turned on or off, another registry port) restarts it.
func (a localAgent) argsFile() string { return strings.TrimSuffix(a.pid, ".pid") + ".args" }

// maxPoolAgents bounds the extra agents (each claims its own subnets
// from the host allocator).
const maxPoolAgents = 46

// ensureAgents runs one agent per declared pool, stops the agents of
// pools no longer declared, and waits for each to be online. weed, when
// not "", is the binary the agents mount volumes with.
func ensureAgents(ctx context.Context, p Paths, st *State, pools []string, weed string, say func(string, ...any)) error {
	if st.PoolMachines == nil {
		st.PoolMachines = map[string]*PoolMachine{}
	}
	for _, pidFile := range poolAgentPidFiles(p) {
		pool := poolOfPidFile(pidFile)
		if !slices.Contains(pools, pool) {
			stopProcess(pidFile, fmt.Sprintf("the agent of pool %s (no longer declared)", pool), say)
		}
	}
	for _, pool := range pools {
		if pool == "default" {
			if err := ensureAgent(ctx, p, st, p.agentFor(pool, 0).withWeed(weed), &st.LocalMachineID, say); err != nil {
				return err
			}
			continue
		}
		pm := st.PoolMachines[pool]
		if pm == nil {
			pm = &PoolMachine{Slot: freeSlot(st)}
			if pm.Slot == 0 {
				return fmt.Errorf("pool %s: the local stack runs at most %d agents besides the default pool's", pool, maxPoolAgents)
			}
			st.PoolMachines[pool] = pm
		}
		if err := ensureAgent(ctx, p, st, p.agentFor(pool, pm.Slot).withWeed(weed), &pm.MachineID, say); err != nil {
			return err
		}
	}
	return nil
}

// poolAgentPidFiles are the pid files of the agents of pools other than
// default.
func poolAgentPidFiles(p Paths) []string {
	files, _ := filepath.Glob(p.file("agent-*.pid"))
	return files
}

// freeSlot is the least slot (subnet number) no pool's agent has, 0 when
// all are taken.
// poolOfPidFile is the pool of an agent-POOL.pid file.
func poolOfPidFile(pidFile string) string {
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(pidFile), "agent-"), ".pid")
}

func freeSlot(st *State) int {
	used := map[int]bool{}
	for _, pm := range st.PoolMachines {
		used[pm.Slot] = true
	}
	for s := 1; s <= maxPoolAgents; s++ {
		if !used[s] {
			return s
		}
	}
	return 0
}

// ensureAgent joins this machine to a's pool through the same join script
// a remote box runs, and keeps its agent running in the background.
// *machineID is the machine it joined as ("" before the first join).
func ensureAgent(ctx context.Context, p Paths, st *State, a localAgent, machineID *string, say func(string, ...any)) error {
	// The local registry is plain HTTP on loopback.
	agentArgs := append([]string{"--insecure-registries", fmt.Sprintf("127.0.0.1:%d", st.RegistryPort)}, a.args...)
	wantArgs := strings.Join(agentArgs, "\n")
	if pidAlive(a.pid) {
		if old, _ := os.ReadFile(a.argsFile()); string(old) == wantArgs {
			say("agent of pool %s already running", a.pool)
			return waitOnline(ctx, p, st, a, *machineID, say)
		}
		stopProcess(a.pid, fmt.Sprintf("the agent of pool %s (its flags changed)", a.pool), say)
	}
	stateDir := filepath.Join(a.dir, "state")
	var cmd *exec.Cmd
	if _, err := os.Stat(filepath.Join(stateDir, "agent.json")); err == nil {
		say("starting the agent of pool %s (already joined)", a.pool)
		cmd = exec.Command(p.Bin+"/levers9-agent", append([]string{"run", "--state-dir", stateDir}, agentArgs...)...)
	} else {
		id, script, err := createLocalMachine(ctx, p, st, a)
		if err != nil {
			return err
		}
		*machineID = id
		if err := st.save(p); err != nil {
			return err
		}
		say("joining this machine to pool %s with the join script %s", a.pool, script)
		cmd = exec.Command("sh", append([]string{script, "--foreground", "--state-dir", stateDir,
			"--etc-dir", filepath.Join(a.dir, "etc"), "--bin-dir", filepath.Join(a.dir, "bin"), "--"}, agentArgs...)...)
	}
	logf, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the agent of pool %s: %w", a.pool, err)
	}
	if err := os.WriteFile(a.pid, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(a.argsFile(), []byte(wantArgs), 0o644); err != nil {
		return err
	}
	_ = cmd.Process.Release()
	return waitOnline(ctx, p, st, a, *machineID, say)
}

func dialLocal(p Paths, st *State) (*grpc.ClientConn, error) {
	tc, err := tlsConfig(p)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", st.GRPCPort), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
}

// createLocalMachine creates the machine for a's pool and writes its join
// script; it returns the machine's ID and the script's path.
func createLocalMachine(ctx context.Context, p Paths, st *State, a localAgent) (string, string, error) {
	conn, err := dialLocal(p, st)
	if err != nil {
		return "", "", err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+st.AdminToken), 60*time.Second)
	defer cancel()
	mc := v1.NewMachineServiceClient(conn)
	name := "local"
	if a.pool != "default" {
		name = "local-" + a.pool
	}
	resp, err := mc.CreateMachine(cctx, &v1.CreateMachineRequest{Pool: a.pool, Name: name})
	if errdefs.IsAlreadyExists(errdefs.FromGRPC(err)) {
		resp, err = mc.CreateMachine(cctx, &v1.CreateMachineRequest{Pool: a.pool})
	}
	if err != nil {
		return "", "", fmt.Errorf("create the local machine in pool %s: %w", a.pool, err)
	}
	if err := os.MkdirAll(a.dir, 0o700); err != nil {
		return "", "", err
	}
	script := filepath.Join(a.dir, "join.sh")
	return resp.Machine.Id, script, enroll.WriteSecretFile(script, []byte(resp.JoinScript))
}

func waitOnline(ctx context.Context, p Paths, st *State, a localAgent, machineID string, say func(string, ...any)) error {
	if machineID == "" {
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
		resp, err := mc.GetMachine(cctx, &v1.GetMachineRequest{Id: machineID})
		cancel()
		if err == nil && resp.Machine.State == v1.MachineState_MACHINE_STATE_ONLINE {
			say("local agent online: machine %s in pool %s over %s", resp.Machine.Id, a.pool, resp.Machine.Transport)
			return nil
		}
		if !pidAlive(a.pid) {
			return fmt.Errorf("the agent of pool %s exited; see %s:\n%s", a.pool, a.log, tail(a.log, 15))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
	return fmt.Errorf("the agent of pool %s did not come online within 60s; see %s", a.pool, a.log)
}
