package localstack

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/levers9/levers9/agent"
	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/devstack"
)

// Down stops what Up started and keeps the data, so the next Up resumes.
func Down(ctx context.Context, p Paths, out io.Writer) error {
	say := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }
	st, err := loadState(p)
	if err != nil {
		return err
	}
	stopProcess(p.file("agent.pid"), "the agent of pool default", say)
	for _, pidFile := range poolAgentPidFiles(p) {
		pool := poolOfPidFile(pidFile)
		stopProcess(pidFile, "the agent of pool "+pool, say)
	}
	releaseNetwork(ctx, st, say)
	// An agent unmounts its volumes when their tasks end; what a stopped
	// agent left (a task still running, a crash) goes here.
	if n := len(unmountVolumes(p, say)); n == 0 {
		say("no volume mounts left under %s", p.Dir)
	}
	stopProcess(p.file("dashboard-web.pid"), "the dashboard web app", say)
	stopProcess(p.file("dashboard-api.pid"), "the dashboard API", say)
	stopProcess(p.file("controlplane.pid"), "the controlplane", say)
	// The filer keeps its metadata in Postgres: stop it first.
	stopSeaweed(p, say)
	if fileExists(p.file("registry/registry.pid")) {
		say("stopping the image registry")
		_ = (&devstack.Registry{Dir: p.file("registry")}).Stop()
	}
	if fileExists(p.file("redis/redis.pid")) {
		say("stopping Redis")
		r := &devstack.Redis{Dir: p.file("redis"), Port: st.RedisPort}
		_ = r.Stop()
		os.Remove(p.file("redis/redis.pid"))
	}
	if fileExists(p.file("pg/data/postmaster.pid")) {
		say("stopping Postgres")
		pg := &devstack.Postgres{Dir: p.file("pg")}
		if err := pg.AttachForStop(); err != nil {
			return err
		}
		if err := pg.StopServer(ctx); err != nil {
			return err
		}
	}
	say("stopped; data kept in %s (remove it to start from scratch)", p.Dir)
	return nil
}

// stopProcess ends the process in pidFile: SIGTERM, then SIGKILL after 15 s.
func stopProcess(pidFile, what string, say func(string, ...any)) {
	if pid, err := readPid(pidFile); err == nil && syscall.Kill(pid, 0) == nil {
		say("stopping %s (pid %d)", what, pid)
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(15 * time.Second)
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if syscall.Kill(pid, 0) == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	os.Remove(pidFile)
}

// releaseNetwork removes the stopped agents' bridges, chains, NAT rules and
// host claims, so nothing of them routes the next Up's containers astray.
func releaseNetwork(ctx context.Context, st *State, say func(string, ...any)) {
	var prefixes []string
	for _, id := range append([]string{st.LocalMachineID}, poolMachineIDs(st)...) {
		if id != "" {
			prefixes = append(prefixes, agent.NodeConfig{MachineID: id}.WithDefaults().Prefix)
		}
	}
	if len(prefixes) == 0 {
		return
	}
	say("removing the agents' container networks (%s)", strings.Join(prefixes, ", "))
	if err := egress.ReleaseHost(ctx, egress.HostConfig{}, prefixes, false); err != nil {
		say("warning: removing the agents' container networks: %v", err)
	}
}

func poolMachineIDs(st *State) []string {
	var ids []string
	for _, pm := range st.PoolMachines {
		if pm != nil {
			ids = append(ids, pm.MachineID)
		}
	}
	return ids
}
