package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/levers9/levers9/agent"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/server"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/sandbox/image/build"
)

// bootstrapSecret authorizes the bench's one workspace.
const bootstrapSecret = "bench-bootstrap-secret-0123456789abcdef"

// pools are the agents' pools, one agent each: builds go to "build" (the
// image service prefers that pool when it exists), tasks to "default",
// so the agent that runs tasks never saw a built image before its task.
var pools = []string{"build", "default"}

// stack is the private levers9 the bench runs against. It mirrors
// bench/tasks's (a command cannot be imported); the differences are the
// registry the controlplane builds into and the build pool.
type stack struct {
	work  string
	reg   *devstack.Registry
	image string // the busybox base image, registry/levers9/bench:v1
	srv   *server.Server
	conn  *grpc.ClientConn
	token string
	ctx   context.Context // carries the token
	tasks v1.TaskServiceClient
	stops []func()
}

func (s *stack) close() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
}

// up starts Postgres, Redis, a registry holding the base image, a
// controlplane with TLS that builds into that registry, and one agent per
// pool, online.
func (s *stack) up(ctx context.Context) error {
	var err error
	if s.work, err = os.MkdirTemp("", "l9i-bench-"); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	// Postgres runs as its own user and must reach its directory.
	if err := os.Chmod(s.work, 0o711); err != nil {
		return err
	}
	s.stops = append(s.stops, func() { os.RemoveAll(s.work) })
	pg, rd, err := s.startServices(ctx)
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := devstack.SelfSignedCert("levers9 bench", time.Hour, "127.0.0.1")
	if err != nil {
		return fmt.Errorf("certificate: %w", err)
	}
	certFile, keyFile := filepath.Join(s.work, "cert.pem"), filepath.Join(s.work, "key.pem")
	if err := errors.Join(os.WriteFile(certFile, certPEM, 0o644), os.WriteFile(keyFile, keyPEM, 0o600)); err != nil {
		return fmt.Errorf("certificate: %w", err)
	}
	cfg, err := s.controlplaneConfig(pg, rd, certFile, keyFile)
	if err != nil {
		return fmt.Errorf("controlplane config: %w", err)
	}
	if err := s.startControlplane(ctx, cfg, certPEM); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	return s.startAgents(ctx, certFile)
}

// startServices starts Postgres, Redis and a registry under s.work and
// pushes the base image.
func (s *stack) startServices(ctx context.Context) (*devstack.Postgres, *devstack.Redis, error) {
	pg, err := devstack.StartPostgres(ctx, filepath.Join(s.work, "pg"), devstack.PostgresOptions{User: "levers9", Password: "bench"})
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	s.stops = append(s.stops, func() { _ = pg.Stop() })
	if err := pg.CreateDatabase(ctx, "levers9"); err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	rd, err := devstack.StartRedis(ctx, filepath.Join(s.work, "redis"), 0, "")
	if err != nil {
		return nil, nil, fmt.Errorf("redis: %w", err)
	}
	s.stops = append(s.stops, func() { _ = rd.Stop() })
	if s.reg, err = devstack.StartRegistry(ctx, filepath.Join(s.work, "registry"), "", 0); err != nil {
		return nil, nil, fmt.Errorf("registry: %w", err)
	}
	s.stops = append(s.stops, func() { _ = s.reg.Stop() })
	res, err := build.BuildBusybox(ctx, s.reg.Addr(), "levers9/bench", "v1", nil, build.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("push the base image: %w", err)
	}
	s.image = res.Ref
	return pg, rd, nil
}

// controlplaneConfig is a validated config on free ports, with TLS, a
// bootstrap secret, the build pool and worker.imageRegistry (where builds
// push and copy steps' blobs are kept) set to the stack's registry.
func (s *stack) controlplaneConfig(pg *devstack.Postgres, rd *devstack.Redis, certFile, keyFile string) (*config.Config, error) {
	cfg := &config.Config{}
	ports := make([]int, 3)
	for i := range ports {
		var err error
		if ports[i], err = devstack.FreeTCPUDPPort(); err != nil {
			return nil, err
		}
	}
	cp := &cfg.Controlplane
	cp.GRPCAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	cp.RESTAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
	cp.TunnelAddr = fmt.Sprintf("127.0.0.1:%d", ports[2])
	cp.Metrics.Addr = "127.0.0.1:0"
	cp.TLS.CertFile, cp.TLS.KeyFile = certFile, keyFile
	cp.Auth.BootstrapSecret = bootstrapSecret
	cp.LogLevel = "warn"
	cp.AgentBinariesDir = s.work
	if err := os.WriteFile(filepath.Join(s.work, "levers9-agent-linux-amd64"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		return nil, err
	}
	p := &cfg.Database.Postgres
	p.Host, p.Port, p.User, p.Password, p.Database = pg.Host, pg.Port, "levers9", "bench", "levers9"
	p.EncryptionKey = "bench-encryption-key-aaaaaaaaaaaa"
	cfg.Database.Redis.Addr = rd.Addr()
	cfg.Worker.DefaultImage = s.image
	cfg.Worker.ImageRegistry = s.reg.Addr()
	cfg.Worker.Pools = map[string]config.Pool{}
	for _, name := range pools {
		cfg.Worker.Pools[name] = config.Pool{}
	}
	cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// startControlplane starts the controlplane, waits for it to be healthy,
// connects and bootstraps a workspace whose token s.ctx carries.
func (s *stack) startControlplane(ctx context.Context, cfg *config.Config, certPEM []byte) error {
	var err error
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if s.srv, err = server.New(cfg, server.Options{Logger: quiet}); err != nil {
		return err
	}
	if err := s.srv.Start(ctx); err != nil {
		return err
	}
	s.stops = append(s.stops, s.srv.Stop)
	if err := waitFor(ctx, 60*time.Second, "controlplane healthy", func() bool { return s.srv.Healthy() && s.srv.Agents() != nil }); err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(certPEM) {
		return errors.New("no certificate in the bench's CA")
	}
	tc := credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	if s.conn, err = grpc.NewClient(s.srv.GRPCAddr(), grpc.WithTransportCredentials(tc)); err != nil {
		return err
	}
	s.stops = append(s.stops, func() { s.conn.Close() })
	auth, err := v1.NewAuthServiceClient(s.conn).Authorize(metadata.AppendToOutgoingContext(ctx, "x-levers9-bootstrap-secret", bootstrapSecret), &v1.AuthorizeRequest{})
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	s.token = auth.Token
	s.ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.Token)
	s.tasks = v1.NewTaskServiceClient(s.conn)
	return nil
}

// startAgents joins one agent per pool and waits until all are online
// with an inventory.
func (s *stack) startAgents(ctx context.Context, caFile string) error {
	// The agents leave their parent cgroups (empty) behind: remove them
	// once the agents have stopped.
	s.stops = append(s.stops, func() {
		v1dirs, _ := filepath.Glob("/sys/fs/cgroup/*/l9ib[0-9]")
		v2dirs, _ := filepath.Glob("/sys/fs/cgroup/l9ib[0-9]")
		for _, d := range append(v1dirs, v2dirs...) {
			_ = os.Remove(d)
		}
	})
	for i, pool := range pools {
		if err := s.joinAgent(ctx, i, pool, caFile); err != nil {
			return fmt.Errorf("agent %d (pool %s): %w", i, pool, err)
		}
	}
	machines := v1.NewMachineServiceClient(s.conn)
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
		return online == len(pools)
	})
}

// joinAgent creates a machine in pool, joins it and starts its agent in
// this process: no egress network (as in bench/tasks), the stack's
// registry allowed over plain HTTP.
func (s *stack) joinAgent(ctx context.Context, i int, pool, caFile string) error {
	created, err := v1.NewMachineServiceClient(s.conn).CreateMachine(s.ctx, &v1.CreateMachineRequest{Pool: pool, Name: "bench-" + pool})
	if err != nil {
		return fmt.Errorf("create machine: %w", err)
	}
	dir := filepath.Join(s.work, fmt.Sprintf("agent%d", i))
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
	node, err := agent.BuildNode(ctx, agent.NodeConfig{StateDir: state.Dir, MachineID: st.MachineID, Prefix: fmt.Sprintf("l9ib%d", i),
		NoNetwork: true, InsecureRegistries: []string{s.reg.Addr()}, Logger: quiet})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	a, err := agent.NewAgent(agent.RunOptions{State: state, Log: quiet, Version: "bench", Runner: node.Runner, HeartbeatInterval: time.Second})
	if err != nil {
		node.Close()
		return err
	}
	if err := a.Start(ctx); err != nil {
		node.Close()
		return fmt.Errorf("start: %w", err)
	}
	s.stops = append(s.stops, func() { a.Stop(); node.Close() })
	return nil
}

// waitFor polls cond every 50 ms until it holds, ctx ends or within
// passes.
func waitFor(ctx context.Context, within time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s", what, within)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
