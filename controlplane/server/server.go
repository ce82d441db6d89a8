// Package server owns the running controlplane: it wires config, store,
// bus, sealing and the API services into a gRPC server (TLS when given a
// certificate), a REST gateway with the same authentication and a body
// limit, health, /metrics on its own address (and on the REST address only
// behind a token), and a dependency loop that migrates Postgres when it first
// answers, re-seals rows onto the current key, and reports unhealthy while
// Postgres or Redis is down (recovering by itself when they return). It
// never logs secrets. Start/Stop follow the repo's start-stop contract.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/levers9/levers9/controlplane/agentdist"
	"github.com/levers9/levers9/controlplane/agents"
	"github.com/levers9/levers9/controlplane/api"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/images"
	"github.com/levers9/levers9/controlplane/seal"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/enroll"
)

// Options are the parts a caller may inject.
type Options struct {
	Logger *slog.Logger
	// DependencyInterval is how often Postgres and Redis are checked
	// (default 2s).
	DependencyInterval time.Duration
}

// Server is one controlplane replica.
type Server struct {
	cfg  *config.Config
	log  *slog.Logger
	opts Options

	reg     *prometheus.Registry
	metrics *metrics
	store   *store.Store
	bus     *bus.Bus
	// keyring is built by the dependency loop once Postgres answers (a
	// passphrase key needs the install's salt from the database), before
	// migrated is set; RPCs wait for migrated, so they never see it nil.
	keyring *seal.Keyring
	health  *health.Server
	ca      atomic.Pointer[enroll.CA]
	agents  atomic.Pointer[agents.Registry]
	// pendingAgents is the registry while its Start keeps failing; only
	// the dependency loop touches it.
	pendingAgents *agents.Registry
	caErr         atomic.Pointer[error]
	deps          *api.Deps
	tasks         *tasks.Service

	public   *grpc.Server // TLS (when configured) on controlplane.grpcAddr
	internal *grpc.Server // plaintext, in memory, for the REST gateway
	grpcLn   net.Listener
	restLn   net.Listener
	memLn    *memListener
	http     *http.Server
	// metricsLn and metricsHTTP serve /metrics on controlplane.metrics.addr;
	// nil when it is "off".
	metricsLn   net.Listener
	metricsHTTP *http.Server

	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards the fields below.
	mu       sync.Mutex
	started  bool
	stopped  bool
	migrated bool
	pgUp     bool
	redisUp  bool
}

// New checks cfg and builds a server; nothing listens until Start.
func New(cfg *config.Config, opts Options) (*Server, error) {
	if err := cfg.CheckStartable(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DependencyInterval == 0 {
		opts.DependencyInterval = 2 * time.Second
	}
	s := &Server{cfg: cfg, log: opts.Logger, opts: opts, reg: prometheus.NewRegistry()}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.metrics = newMetrics(s.reg)
	return s, nil
}

// Start opens the listeners and starts serving; it returns once they are
// bound. Postgres and Redis need not be up: the dependency loop waits for
// them. A Start that fails closes what it opened, and Stop after it does
// nothing.
func (s *Server) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("controlplane server: already started")
	}
	s.started = true
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			s.stopped = true // Stop after a failed Start has nothing to stop
		}
	}()
	for _, w := range s.cfg.ShippedDefaults() {
		s.log.Warn(w.Message, "key", w.Key, "shipped_default", true)
	}
	if s.store, err = store.Open(ctx, s.cfg.Database.Postgres.ConnString(), s.log.With("component", "store")); err != nil {
		return err
	}
	undo = append(undo, s.store.Close)
	r := s.cfg.Database.Redis
	s.bus = bus.New(bus.Options{Addr: r.Addr, Password: r.Password, DB: r.DB})
	undo = append(undo, func() { _ = s.bus.Close() })
	deps, err := s.newDeps()
	if err != nil {
		return err
	}
	authn := &auth.Authenticator{Store: s.store}
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)

	var creds []grpc.ServerOption
	var tlsCfg *tls.Config
	if c := s.cfg.Controlplane.TLS; c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return fmt.Errorf("load controlplane certificate %s: %w", c.CertFile, err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		creds = append(creds, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s.public = s.newGRPC(deps, authn, creds...)
	s.internal = s.newGRPC(deps, authn)

	if s.grpcLn, err = net.Listen("tcp", s.cfg.Controlplane.GRPCAddr); err != nil {
		return fmt.Errorf("listen for gRPC on %s: %w", s.cfg.Controlplane.GRPCAddr, err)
	}
	undo = append(undo, func() { s.grpcLn.Close() })
	if s.restLn, err = net.Listen("tcp", s.cfg.Controlplane.RESTAddr); err != nil {
		return fmt.Errorf("listen for REST on %s: %w", s.cfg.Controlplane.RESTAddr, err)
	}
	undo = append(undo, func() { s.restLn.Close() })
	if deps.Public, err = s.publicEndpoints(tlsCfg != nil); err != nil {
		return err
	}
	if a := s.cfg.Controlplane.Metrics.Addr; a != config.MetricsOff {
		if s.metricsLn, err = net.Listen("tcp", a); err != nil {
			return fmt.Errorf("listen for metrics on %s (controlplane.metrics.addr): %w", a, err)
		}
		undo = append(undo, func() { s.metricsLn.Close() })
		mux := http.NewServeMux()
		mux.Handle("/metrics", s.metricsHandler())
		s.metricsHTTP = &http.Server{Handler: limitBody(mux, maxMessageBytes), ReadHeaderTimeout: 10 * time.Second}
	}
	s.memLn = newMemListener()
	handler, err := s.restHandler(ctx)
	if err != nil {
		return err
	}
	s.http = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsCfg}

	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	undo = append(undo, cancel)
	if err := s.tasks.Start(loopCtx); err != nil {
		return err
	}
	s.cancel = cancel
	if s.metricsHTTP != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.metricsHTTP.Serve(s.metricsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("metrics server stopped", "err", err)
			}
		}()
	}
	s.wg.Add(4)
	go func() { defer s.wg.Done(); _ = s.public.Serve(s.grpcLn) }()
	go func() { defer s.wg.Done(); _ = s.internal.Serve(s.memLn) }()
	go func() {
		defer s.wg.Done()
		var err error
		if tlsCfg != nil {
			err = s.http.ServeTLS(s.restLn, "", "")
		} else {
			err = s.http.Serve(s.restLn)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("REST server stopped", "err", err)
		}
	}()
	go func() { defer s.wg.Done(); s.dependencyLoop(loopCtx) }()
	s.log.Info("controlplane listening", "grpc", s.grpcLn.Addr().String(), "rest", s.restLn.Addr().String(),
		"metrics", s.MetricsAddr(), "tls", tlsCfg != nil, "postgres", s.cfg.Database.Postgres.Redacted(), "redis", r.Addr)
	return nil
}

// newDeps builds what the API services share, with the task service.
func (s *Server) newDeps() (*api.Deps, error) {
	binDir := s.cfg.Controlplane.AgentBinariesDir
	if binDir == "" {
		binDir = agentdist.DefaultDir()
	}
	src, _ := agentdist.FindSource(binDir)
	if wd, err := os.Getwd(); err == nil && src == "" {
		src, _ = agentdist.FindSource(wd)
	}
	deps := &api.Deps{Store: s.store, Bus: s.bus, Log: s.log.With("component", "api"),
		BootstrapSecret: s.cfg.Controlplane.Auth.BootstrapSecret, Config: s.cfg, CA: s.agentCA, Metrics: s.metrics,
		Dist:     agentdist.New(binDir, s.cfg.Controlplane.AgentDevBuilds, src, s.log.With("component", "agentdist")),
		Presence: presence{s}}
	var mountEnv []string
	var err error
	if deps.Volumes, mountEnv, err = volumeDrivers(s.cfg, s.log); err != nil {
		return nil, err
	}
	if s.tasks, err = tasks.New(tasks.Config{Store: s.store, Redis: s.bus.Redis(), Config: s.cfg, Log: s.log.With("component", "tasks"),
		RegistryLogins: deps, VolumeMountEnv: mountEnv,
		Agents: func() tasks.Agents {
			if r := s.agents.Load(); r != nil {
				return r
			}
			return nil
		},
		Secrets: secretOpener{s},
		Kube:    kubeClients(s.cfg),
		WorkerJoin: func() tasks.WorkerJoin {
			k := s.cfg.Worker.Kubernetes
			j := tasks.WorkerJoin{Controlplane: k.Controlplane, CAPEM: []byte(deps.Public.CAPEM), AgentArgs: k.AgentArgs}
			if j.Controlplane == "" {
				j.Controlplane = deps.Public.GRPC
			}
			return j
		}}); err != nil {
		return nil, err
	}
	deps.Tasks = s.tasks
	deps.Images = images.New(images.Deps{Store: s.store, Tasks: s.tasks.Submitter, Config: s.cfg, Logins: deps,
		Log: s.log.With("component", "images")})
	s.deps = deps
	return deps, nil
}

func (s *Server) newGRPC(deps *api.Deps, authn *auth.Authenticator, opts ...grpc.ServerOption) *grpc.Server {
	opts = append(opts,
		grpc.ChainUnaryInterceptor(versionUnary(), s.metrics.unary(), s.readyUnary(), authn.Unary()),
		grpc.ChainStreamInterceptor(s.readyStream(), authn.Stream()),
		grpc.MaxRecvMsgSize(maxMessageBytes),
	)
	g := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(g, s.health)
	registerServices(g, deps, authn)
	return g
}

// Stop stops serving and waits for every goroutine. Safe twice or before
// Start.
func (s *Server) Stop() {
	s.mu.Lock()
	if !s.started || s.stopped {
		s.stopped = true
		s.mu.Unlock()
		return
	}
	s.stopped = true
	s.mu.Unlock()
	s.cancel()
	s.tasks.Stop()
	if r := s.agents.Load(); r != nil {
		r.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.http.Shutdown(ctx)
	if s.metricsHTTP != nil {
		_ = s.metricsHTTP.Shutdown(ctx)
	}
	stopGRPC(s.public, 5*time.Second)
	stopGRPC(s.internal, 5*time.Second)
	s.wg.Wait()
	s.store.Close()
	_ = s.bus.Close()
}

func stopGRPC(g *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		g.Stop()
		<-done
	}
}

// GRPCAddr is the bound gRPC address.
func (s *Server) GRPCAddr() string { return s.grpcLn.Addr().String() }

// RESTAddr is the bound REST address.
func (s *Server) RESTAddr() string { return s.restLn.Addr().String() }

// MetricsAddr is the bound metrics address, or "" when
// controlplane.metrics.addr is "off".
func (s *Server) MetricsAddr() string {
	if s.metricsLn == nil {
		return ""
	}
	return s.metricsLn.Addr().String()
}

// Healthy reports whether Postgres and Redis answer and migrations ran.
func (s *Server) Healthy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.migrated && s.pgUp && s.redisUp
}
