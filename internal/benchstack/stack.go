// Package benchstack owns the private levers9 the benchmarks under bench/
// run against: Postgres, Redis and a docker-registry (internal/devstack) on
// free loopback ports under a temporary directory, a controlplane with TLS
// (controlplane/server) and agents (the agent package) in the calling
// process, all joined and online when Start returns, and all removed again
// by Close: processes, the directory, the agents' containers and their
// empty parent cgroups. It also gives the baselines the benchmarks share:
// the first-line timing of a task and a bare runc bundle with the agent's
// own hardened spec.
//
// It never touches the system-wide Postgres or Redis, never changes the
// host's network (the agents run containers without the egress network),
// and is used only by bench/: it needs root, runc and Debian's postgresql,
// redis-server and docker-registry packages. Its API is internal and
// changes with the benchmarks.
package benchstack

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

// bootstrapSecret authorizes the stack's one workspace.
const bootstrapSecret = "bench-bootstrap-secret-0123456789abcdef"

// Options are what the benchmarks' stacks differ in. Name and Pools are
// required.
type Options struct {
	// Name (a few lowercase letters) tags what the stack puts on the host,
	// so that two benchmarks never share it: the temporary directory (<Name>-bench-*), agent i's
	// containers and parent cgroup (<Name>b<i>) and the bare bundle's
	// (<Name>b-bare).
	Name string
	// Pools has one entry per agent: the pool it joins. Every pool named is
	// configured as a worker pool ("default" always is); with "build" among
	// them the image service sends builds there.
	Pools []string
	// BuildRegistry sets worker.imageRegistry to the stack's registry, so
	// that image builds push there and keep copy steps' blobs there.
	BuildRegistry bool
}

// Stack is a running private levers9. Start and Close must not run
// concurrently with anything else; FirstLine is safe for concurrent use.
type Stack struct {
	// Work is the stack's temporary directory, removed by Close; callers
	// may keep their own files under it.
	Work string
	// Registry holds Image; the agents pull from it over plain HTTP.
	Registry *devstack.Registry
	// Image is the busybox image pushed at start
	// (<registry>/levers9/bench:v1) and worker.defaultImage.
	Image string
	// Conn is a client connection to the controlplane's gRPC API.
	Conn *grpc.ClientConn
	// Token is the bootstrapped workspace's bearer token.
	Token string

	opts  Options
	srv   *server.Server
	ctx   context.Context // Start's, carrying Token
	tasks v1.TaskServiceClient
	stops []func() // Close runs them last to first
	// agentMetrics are the agents' registries, read for the phases of
	// their starts.
	agentMetrics []*agent.Metrics
}

// Start brings the stack up: Postgres, Redis, the registry holding Image,
// the controlplane and one agent per pool, online with an inventory. ctx
// bounds the stack's life: cancelling it (on an interrupt, say) ends the
// controlplane's and agents' loops and fails calls in flight, though only
// Close removes what the stack left. On error Start has removed everything
// it started.
func Start(ctx context.Context, opts Options) (*Stack, error) {
	if opts.Name == "" || len(opts.Pools) == 0 {
		return nil, errors.New("benchstack: Options.Name and Options.Pools are required")
	}
	s := &Stack{opts: opts}
	if err := s.up(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close stops what Start started and what OnClose added, last first, and
// removes Work. It is safe to call twice.
func (s *Stack) Close() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
	s.stops = nil
}

// OnClose adds f to what Close runs; it runs before everything added
// earlier, the stack's own parts among them.
func (s *Stack) OnClose(f func()) { s.stops = append(s.stops, f) }

func (s *Stack) up(ctx context.Context) error {
	var err error
	if s.Work, err = os.MkdirTemp("", s.opts.Name+"-bench-"); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	// Postgres runs as its own user and must reach its directory.
	if err := os.Chmod(s.Work, 0o711); err != nil {
		return err
	}
	s.OnClose(func() { os.RemoveAll(s.Work) })
	pg, rd, err := s.startServices(ctx)
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := devstack.SelfSignedCert("levers9 bench", time.Hour, "127.0.0.1")
	if err != nil {
		return fmt.Errorf("certificate: %w", err)
	}
	certFile, keyFile := filepath.Join(s.Work, "cert.pem"), filepath.Join(s.Work, "key.pem")
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

// startServices starts Postgres, Redis and a registry under Work and
// pushes the busybox image.
func (s *Stack) startServices(ctx context.Context) (*devstack.Postgres, *devstack.Redis, error) {
	pg, err := devstack.StartPostgres(ctx, filepath.Join(s.Work, "pg"), devstack.PostgresOptions{User: "levers9", Password: "bench"})
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	s.OnClose(func() { _ = pg.Stop() })
	if err := pg.CreateDatabase(ctx, "levers9"); err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	rd, err := devstack.StartRedis(ctx, filepath.Join(s.Work, "redis"), 0, "")
	if err != nil {
		return nil, nil, fmt.Errorf("redis: %w", err)
	}
	s.OnClose(func() { _ = rd.Stop() })
	if s.Registry, err = devstack.StartRegistry(ctx, filepath.Join(s.Work, "registry"), "", 0); err != nil {
		return nil, nil, fmt.Errorf("registry: %w", err)
	}
	s.OnClose(func() { _ = s.Registry.Stop() })
	res, err := build.BuildBusybox(ctx, s.Registry.Addr(), "levers9/bench", "v1", nil, build.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("push the busybox image: %w", err)
	}
	s.Image = res.Ref
	return pg, rd, nil
}

// controlplaneConfig is a validated config on free ports, with TLS, a
// bootstrap secret, the agents' pools and, with Options.BuildRegistry,
// worker.imageRegistry set to the stack's registry.
func (s *Stack) controlplaneConfig(pg *devstack.Postgres, rd *devstack.Redis, certFile, keyFile string) (*config.Config, error) {
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
	cp.AgentBinariesDir = s.Work
	if err := os.WriteFile(filepath.Join(s.Work, "levers9-agent-linux-amd64"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		return nil, err
	}
	p := &cfg.Database.Postgres
	p.Host, p.Port, p.User, p.Password, p.Database = pg.Host, pg.Port, "levers9", "bench", "levers9"
	p.EncryptionKey = "bench-encryption-key-aaaaaaaaaaaa"
	cfg.Database.Redis.Addr = rd.Addr()
	cfg.Worker.DefaultImage = s.Image
	if s.opts.BuildRegistry {
		cfg.Worker.ImageRegistry = s.Registry.Addr()
	}
	cfg.Worker.Pools = map[string]config.Pool{}
	for _, name := range s.opts.Pools {
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
func (s *Stack) startControlplane(ctx context.Context, cfg *config.Config, certPEM []byte) error {
	var err error
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if s.srv, err = server.New(cfg, server.Options{Logger: quiet}); err != nil {
		return err
	}
	if err := s.srv.Start(ctx); err != nil {
		return err
	}
	s.OnClose(s.srv.Stop)
	if err := waitFor(ctx, 60*time.Second, "controlplane healthy", func() bool { return s.srv.Healthy() && s.srv.Agents() != nil }); err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(certPEM) {
		return errors.New("no certificate in the bench's CA")
	}
	tc := credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	if s.Conn, err = grpc.NewClient(s.srv.GRPCAddr(), grpc.WithTransportCredentials(tc)); err != nil {
		return err
	}
	s.OnClose(func() { s.Conn.Close() })
	auth, err := v1.NewAuthServiceClient(s.Conn).Authorize(metadata.AppendToOutgoingContext(ctx, "x-levers9-bootstrap-secret", bootstrapSecret), &v1.AuthorizeRequest{})
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	s.Token = auth.Token
	s.ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.Token)
	s.tasks = v1.NewTaskServiceClient(s.Conn)
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
