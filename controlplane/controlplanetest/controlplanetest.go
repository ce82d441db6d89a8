// Package controlplanetest runs a real controlplane inside a test process:
// private Postgres and Redis servers (from internal/devstack), a fresh
// database per test, and a server on free 127.0.0.1 ports whose JSON logs
// tests can read. Test-only; never imported by production code.
package controlplanetest

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/server"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
)

// Env is the shared services of one test binary.
type Env struct {
	Dir   string
	PG    *devstack.Postgres
	Redis *devstack.Redis
	dbs   atomic.Int64
	// redisDBs numbers each Config's Redis database.
	redisDBs atomic.Int64
	tmpl     template
}

// StartEnv starts Postgres and Redis for a test binary (call from
// TestMain). The Redis password is set so the no-password warning can be
// tested both ways.
func StartEnv(ctx context.Context) (*Env, error) {
	dir, err := os.MkdirTemp("", "l9cp-")
	if err != nil {
		return nil, err
	}
	// The postgres user must reach the data dir under it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	e := &Env{Dir: dir}
	if e.PG, err = devstack.StartPostgres(ctx, filepath.Join(dir, "pg"), devstack.PostgresOptions{}); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	if e.Redis, err = devstack.StartRedis(ctx, filepath.Join(dir, "redis"), 0, "redis-test-pw"); err != nil {
		_ = e.PG.Stop()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start redis: %w", err)
	}
	return e, nil
}

// Main is a TestMain body: start the env, run, stop, then fail if a
// goroutine outlived the tests (every test stops what it started in
// t.Cleanup, so none should). When the services cannot start it fails
// under CI and skips the package elsewhere.
func Main(m *testing.M, envOut **Env) int { return run(m, envOut, testenv.InCI()) }

// MainNoSkip is Main for packages whose tests never skip (the store's):
// when the services cannot start it fails everywhere, not only under CI.
func MainNoSkip(m *testing.M, envOut **Env) int { return run(m, envOut, true) }

func run(m *testing.M, envOut **Env, failWithoutServices bool) int {
	// A fuzzing run (and each of its worker processes) runs no tests that
	// need the services; starting Postgres per worker would stall it.
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		return m.Run()
	}
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		return m.Run()
	}
	e, err := StartEnv(context.Background())
	if err != nil {
		if failWithoutServices {
			fmt.Fprintln(os.Stderr, "controlplanetest:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "controlplanetest: skipping, services unavailable:", err)
		return 0
	}
	*envOut = e
	code := m.Run()
	e.Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "controlplanetest: goroutines outlived the tests:", err)
			return 1
		}
	}
	return code
}

// Stop stops the services and removes their files.
func (e *Env) Stop() {
	_ = e.Redis.Stop()
	_ = e.PG.Stop()
	os.RemoveAll(e.Dir)
}

// NewDatabase creates an empty database for one test.
func (e *Env) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("l9t_%d_%d", os.Getpid(), e.dbs.Add(1))
	if err := e.PG.CreateDatabase(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	return name
}

// Config returns a config pointing at the env's services and a new
// database, listening on free ports.
func (e *Env) Config(t testing.TB) *config.Config {
	t.Helper()
	c := &config.Config{}
	c.Controlplane.GRPCAddr = "127.0.0.1:0"
	c.Controlplane.RESTAddr = "127.0.0.1:0"
	c.Controlplane.Metrics.Addr = "127.0.0.1:0"
	tp, err := devstack.FreeTCPUDPPort()
	if err != nil {
		t.Fatal(err)
	}
	c.Controlplane.TunnelAddr = fmt.Sprintf("127.0.0.1:%d", tp)
	c.Controlplane.LogLevel = "debug"
	c.Controlplane.Auth.BootstrapSecret = "test-bootstrap-secret-0123456789abcdef"
	pg := &c.Database.Postgres
	pg.Host, pg.Port, pg.User, pg.Password = e.PG.Host, e.PG.Port, e.PG.User, e.PG.Password
	pg.Database = e.NewDatabase(t)
	// Its own Redis database too: queues are named by pool, and parallel
	// tests' controlplanes must not take each other's work.
	c.Database.Redis.DB = int(e.redisDBs.Add(1) % devstack.RedisDatabases)
	pg.EncryptionKey = "test-encryption-key-aaaaaaaaaaaa"
	c.Database.Redis.Addr = e.Redis.Addr()
	c.Database.Redis.Password = e.Redis.Password
	c.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// Instance is a running controlplane.
type Instance struct {
	Server *server.Server
	Config *config.Config
	Logs   *Logs
	Conn   *grpc.ClientConn
}

// Start runs a controlplane on cfg until the test ends and waits until it
// is healthy (unless the dependencies are down on purpose: wait=false).
func Start(t testing.TB, cfg *config.Config, wait bool) *Instance {
	t.Helper()
	logs := &Logs{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := server.New(cfg, server.Options{Logger: log, DependencyInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	creds := insecure.NewCredentials()
	if cfg.Controlplane.TLS.CertFile != "" {
		pool := x509.NewCertPool()
		pem, err := os.ReadFile(cfg.Controlplane.TLS.CertFile)
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(pem)
		creds = credentials.NewTLS(&tls.Config{RootCAs: pool})
	}
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	in := &Instance{Server: srv, Config: cfg, Logs: logs, Conn: conn}
	if wait {
		Eventually(t, 30*time.Second, "controlplane healthy", srv.Healthy)
	}
	return in
}

// WaitTunnelEndpoint waits for in's tunnel endpoint to run. It starts once
// the dependency check has passed, which under a loaded `make test` (every
// package's stacks at once) took over 10 s: this is a wait for readiness,
// not a timing check, so it allows 30.
func WaitTunnelEndpoint(t testing.TB, in *Instance) {
	t.Helper()
	Eventually(t, 30*time.Second, "tunnel endpoint", func() bool { return in.Server.Agents() != nil })
}

// Eventually is testenv.Eventually, kept for the controlplane's tests.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, within, what, cond)
}

// Logs collects JSON log lines. Safe for concurrent use.
type Logs struct {
	testenv.SyncBuffer
}

// Records parses the log lines.
func (l *Logs) Records() []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// Find returns the records whose msg contains substr.
func (l *Logs) Find(substr string) []map[string]any {
	var out []map[string]any
	for _, r := range l.Records() {
		if msg, _ := r["msg"].(string); strings.Contains(msg, substr) {
			out = append(out, r)
		}
	}
	return out
}

// Exec runs SQL against the instance's database (to age rows and the like).
func Exec(t testing.TB, in *Instance, sql string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), in.Config.Database.Postgres.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// StandInAgent points cfg's agent binaries at a directory holding a
// stand-in linux/amd64 agent: CreateMachine wants one to offer, and machines
// that never download it (scripted ones, tests of the API) need nothing
// more.
func StandInAgent(t testing.TB, cfg *config.Config) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "levers9-agent-linux-amd64"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.Controlplane.AgentBinariesDir = dir
}
