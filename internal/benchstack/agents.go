package benchstack

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/levers9/levers9/agent"
	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// startAgents joins one agent per pool and waits until all are online
// with an inventory.
func (s *Stack) startAgents(ctx context.Context, caFile string) error {
	// The agents leave their parent cgroups (empty) behind: remove them
	// once the agents have stopped.
	s.OnClose(func() {
		v1dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + s.opts.Name + "b[0-9]")
		v2dirs, _ := filepath.Glob("/sys/fs/cgroup/" + s.opts.Name + "b[0-9]")
		for _, d := range append(v1dirs, v2dirs...) {
			_ = os.Remove(d)
		}
	})
	for i, pool := range s.opts.Pools {
		if err := s.joinAgent(ctx, i, pool, caFile); err != nil {
			return fmt.Errorf("agent %d (pool %s): %w", i, pool, err)
		}
	}
	machines := v1.NewMachineServiceClient(s.Conn)
	return waitFor(ctx, 60*time.Second, "agents online", func() bool {
		r, err := machines.ListMachines(s.ctx, &v1.ListMachinesRequest{})
		if err != nil {
			return false
		}
		online := 0
		for _, m := range r.Machines {
			if m.State == v1.MachineState_MACHINE_STATE_ONLINE && m.GetInventory().GetCpus() > 0 {
				online++
			}
		}
		return online == len(s.opts.Pools)
	})
}

// joinAgent creates machine bench-<i> in pool, joins it and starts its
// agent in this process: no egress network (two agents in one network
// namespace would share a bridge subnet, and the host's FORWARD chain is
// not a benchmark's to change), the stack's registry allowed over plain
// HTTP.
func (s *Stack) joinAgent(ctx context.Context, i int, pool, caFile string) error {
	created, err := v1.NewMachineServiceClient(s.Conn).CreateMachine(s.ctx, &v1.CreateMachineRequest{Pool: pool, Name: fmt.Sprintf("bench-%d", i)})
	if err != nil {
		return fmt.Errorf("create machine: %w", err)
	}
	dir := filepath.Join(s.Work, fmt.Sprintf("agent%d", i))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(created.JoinToken), 0o600); err != nil {
		return err
	}
	state := agent.State{Dir: filepath.Join(dir, "state")}
	st, err := agent.Join(ctx, agent.JoinOptions{Controlplane: s.srv.GRPCAddr(), CAFile: caFile, TokenFile: tokenFile, State: state, Version: "bench"})
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := agent.BuildNode(ctx, agent.NodeConfig{StateDir: state.Dir, MachineID: st.MachineID, Prefix: fmt.Sprintf("%sb%d", s.opts.Name, i),
		NoNetwork: true, InsecureRegistries: []string{s.Registry.Addr()}, Logger: quiet})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	m := agent.NewMetrics()
	s.agentMetrics = append(s.agentMetrics, m)
	a, err := agent.NewAgent(agent.RunOptions{State: state, Log: quiet, Version: "bench", Runner: node.Runner, HeartbeatInterval: time.Second, Metrics: m})
	if err != nil {
		node.Close()
		return err
	}
	if err := a.Start(ctx); err != nil {
		node.Close()
		return fmt.Errorf("start: %w", err)
	}
	s.OnClose(func() { a.Stop(); node.Close() })
	return nil
}

// startPhases sums worker_task_start_phase_seconds over the agents, by
// phase: the difference across one run is that run's start, as long as
// nothing else starts meanwhile.
func (s *Stack) startPhases() (map[string]time.Duration, error) {
	sums := map[string]time.Duration{}
	for _, m := range s.agentMetrics {
		fams, err := m.Registry.Gather()
		if err != nil {
			return nil, fmt.Errorf("gather agent metrics: %w", err)
		}
		for _, f := range fams {
			if f.GetName() != "worker_task_start_phase_seconds" {
				continue
			}
			for _, mt := range f.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "phase" {
						sums[l.GetValue()] += time.Duration(mt.GetHistogram().GetSampleSum() * float64(time.Second))
					}
				}
			}
		}
	}
	return sums, nil
}
