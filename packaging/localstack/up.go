package localstack

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/cli"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/procstat"
	"github.com/levers9/levers9/internal/seaweed"
)

// Up brings the stack up (or finds it up) and saves the "local" CLI
// context. Progress goes to out.
func Up(ctx context.Context, p Paths, out io.Writer) error {
	say := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }
	if err := os.MkdirAll(p.Dir, 0o711); err != nil {
		return err
	}
	// Postgres runs as the postgres user and must traverse into its dir.
	if err := os.Chmod(p.Dir, 0o711); err != nil {
		return err
	}
	st, err := loadState(p)
	if err != nil {
		return err
	}

	pgRunning := answers(st.PostgresPort) && fileExists(p.file("pg/data/postmaster.pid"))
	if st.PostgresPort, err = pickPort(st.PostgresPort, 0, pgRunning); err != nil {
		return err
	}
	pg := &devstack.Postgres{}
	if pgRunning {
		say("Postgres already running on 127.0.0.1:%d", st.PostgresPort)
	} else {
		say("starting Postgres on 127.0.0.1:%d (data in %s)", st.PostgresPort, p.file("pg"))
		pg, err = devstack.StartPostgres(ctx, p.file("pg"), devstack.PostgresOptions{Port: st.PostgresPort, User: "levers9", Password: st.PostgresPassword})
		if err != nil {
			return fmt.Errorf("start Postgres: %w (log: %s)", err, p.file("pg/postgres.log"))
		}
		if err := pg.CreateDatabase(ctx, "levers9"); err != nil && !strings.Contains(err.Error(), "already exists") {
			return err
		}
	}

	redisRunning := answers(st.RedisPort) && fileExists(p.file("redis/redis.pid"))
	if st.RedisPort, err = pickPort(st.RedisPort, 0, redisRunning); err != nil {
		return err
	}
	if redisRunning {
		say("Redis already running on 127.0.0.1:%d", st.RedisPort)
	} else {
		say("starting Redis on 127.0.0.1:%d", st.RedisPort)
		if _, err := devstack.StartRedis(ctx, p.file("redis"), st.RedisPort, st.RedisPassword); err != nil {
			return fmt.Errorf("start Redis: %w", err)
		}
	}

	weed, sw, err := ensureVolumes(ctx, p, st, out, say)
	if err != nil {
		return err
	}
	if err := ensureRegistry(ctx, p, st, say); err != nil {
		return err
	}
	if err := ensureRunner(ctx, p, st, out, say); err != nil {
		return err
	}
	if err := ensureCert(p); err != nil {
		return err
	}
	cpRunning := pidAlive(p.file("controlplane.pid")) && answers(st.GRPCPort)
	for _, port := range []struct {
		v    *int
		pref int
	}{{&st.GRPCPort, 1993}, {&st.RESTPort, 1994}, {&st.TunnelPort, 1995}, {&st.MetricsPort, 1996}} {
		if *port.v, err = pickPort(*port.v, port.pref, cpRunning); err != nil {
			return err
		}
	}
	if err := st.save(p); err != nil {
		return err
	}
	pools, changed, err := writeControlplaneConfig(p, st, sw, say)
	if err != nil {
		return err
	}
	if cpRunning && changed {
		stopProcess(p.file("controlplane.pid"), "the controlplane (its config changed)", say)
		cpRunning = false
	}
	if cpRunning {
		say("controlplane already running (gRPC 127.0.0.1:%d)", st.GRPCPort)
	} else {
		say("starting the controlplane: gRPC 127.0.0.1:%d, REST 127.0.0.1:%d, metrics http://127.0.0.1:%d/metrics (log: %s)", st.GRPCPort, st.RESTPort, st.MetricsPort, p.file("controlplane.log"))
		if err := startControlplane(p); err != nil {
			return err
		}
	}
	if err := waitHealthy(ctx, p, st); err != nil {
		return err
	}
	say("controlplane healthy")
	if err := ensureContext(ctx, p, st, say); err != nil {
		return err
	}
	if err := st.save(p); err != nil {
		return err
	}
	if err := pickDashboardWebPort(p, st); err != nil {
		return err
	}
	if err := ensureDashboard(ctx, p, st, say); err != nil {
		return err
	}
	if err := ensureDashboardWeb(ctx, p, dashboardWebDir(p), st, say); err != nil {
		return err
	}
	if err := ensureAgents(ctx, p, st, pools, weed, say); err != nil {
		return err
	}
	if err := runDemo(ctx, p, st, out, say); err != nil {
		return err
	}
	if sw == nil {
		return nil
	}
	return runVolumeDemo(ctx, p, st, out, say)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// pidAlive reports whether the process in pidFile runs. A process that
// exited but was not reaped yet (a zombie: make up started it and released
// it, and its parent lives on) is not alive, though signal 0 still reaches
// it: without this, an agent that died at start looked alive for a minute.
func pidAlive(pidFile string) bool {
	pid, err := readPid(pidFile)
	if err != nil || syscall.Kill(pid, 0) != nil {
		return false
	}
	st, err := procstat.Read(pid)
	return err == nil && !st.Exited()
}

func readPid(pidFile string) (int, error) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func ensureCert(p Paths) error {
	if fileExists(p.file("tls/cert.pem")) && fileExists(p.file("tls/key.pem")) {
		return nil
	}
	certPEM, keyPEM, err := devstack.SelfSignedCert("levers9 local stack", 2*365*24*time.Hour)
	if err != nil {
		return err
	}
	if err := enroll.WriteSecretFile(p.file("tls/key.pem"), keyPEM); err != nil {
		return err
	}
	return os.WriteFile(p.file("tls/cert.pem"), certPEM, 0o644)
}

// writeControlplaneConfig writes .levers9-dev/controlplane.yaml: make up's
// keys (ports, certificate, secrets, the demo image, the local SeaweedFS
// filer when sw is not nil) with the user's
// local files merged over them (see mergeLocalConfig), checked by the
// controlplane's own loader. It returns the declared pools and whether
// the file changed.
func writeControlplaneConfig(p Paths, st *State, sw *seaweed.Layout, say func(string, ...any)) ([]string, bool, error) {
	yml := fmt.Sprintf(`# Written by make up; holds secrets (mode 0600).
controlplane:
  grpcAddr: 127.0.0.1:%d
  restAddr: 127.0.0.1:%d
  tunnelAddr: 127.0.0.1:%d
  metrics:
    addr: 127.0.0.1:%d
  tls:
    certFile: %s
    keyFile: %s
  auth:
    bootstrapSecret: %q
database:
  postgres:
    host: 127.0.0.1
    port: %d
    user: levers9
    password: %q
    database: levers9
    encryptionKey: %q
  redis:
    addr: 127.0.0.1:%d
    password: %q
worker:
  # The demo image make up pushed; tasks that name no image run it.
  defaultImage: %s
  # The stack's registry: image builds (levers9 image build) push there.
  imageRegistry: 127.0.0.1:%d
imageService:
  runner:
    # Recipe bases and Python functions' images without a registry
    # (levers9-runner:latest, which make up pushes) come from here.
    baseImageRegistry: 127.0.0.1:%d
`, st.GRPCPort, st.RESTPort, st.TunnelPort, st.MetricsPort, p.file("tls/cert.pem"), p.file("tls/key.pem"), st.BootstrapSecret,
		st.PostgresPort, st.PostgresPassword, st.EncryptionKey, st.RedisPort, st.RedisPassword, st.DemoImage, st.RegistryPort, st.RegistryPort)
	if sw != nil {
		yml += fmt.Sprintf(`volumes:
  # The local SeaweedFS make up runs (unless LEVERS9_VOLUMES=0).
  seaweedfs:
    filerAddr: %s
    filerURL: %s
    # Its credentials (mTLS certificates, JWT keys; 0600 files).
    securityDir: %s
`, sw.FilerAddr(), sw.FilerURL(), sw.SecurityDir())
	}
	out, used, err := mergeLocalConfig([]byte(yml), p.localConfigFiles(), os.LookupEnv)
	if err != nil {
		return nil, false, err
	}
	if len(used) > 0 {
		say("merged %s over the generated controlplane config", strings.Join(used, " and "))
		out = append([]byte("# Written by make up from its own keys and "+strings.Join(used, ", ")+"; holds secrets (mode 0600).\n"), out...)
	}
	cfg, err := config.Load(bytes.NewReader(out), os.LookupEnv)
	if err != nil {
		return nil, false, fmt.Errorf("the generated controlplane config: %w", err)
	}
	old, _ := os.ReadFile(p.file("controlplane.yaml"))
	return cfg.Worker.PoolNames(), !bytes.Equal(old, out), enroll.WriteSecretFile(p.file("controlplane.yaml"), out)
}

func startControlplane(p Paths) error {
	cmd := exec.Command(p.Bin+"/levers9-controlplane", "--config", p.file("controlplane.yaml"))
	if err := startDetached(cmd, p.file("controlplane.log"), p.file("controlplane.pid")); err != nil {
		return fmt.Errorf("start %s (run make build first): %w", cmd.Path, err)
	}
	return nil
}

// startDetached starts cmd in a session of its own, its output appended to
// logPath (created 0600), writes its pid to pidPath and lets it run on
// without this process.
func startDetached(cmd *exec.Cmd, logPath, pidPath string) error {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := os.WriteFile(pidPath, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	return cmd.Process.Release()
}

func tlsConfig(p Paths) (*tls.Config, error) {
	pemBytes, err := os.ReadFile(p.file("tls/cert.pem"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemBytes)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

func waitHealthy(ctx context.Context, p Paths, st *State) error {
	tc, err := tlsConfig(p)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz", st.RESTPort)
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := client.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = strings.TrimSpace(string(b))
		} else {
			last = err.Error()
		}
		if !pidAlive(p.file("controlplane.pid")) {
			return fmt.Errorf("the controlplane exited; see %s:\n%s", p.file("controlplane.log"), tail(p.file("controlplane.log"), 15))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return fmt.Errorf("controlplane not healthy after 60s (%s); see %s", last, p.file("controlplane.log"))
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ensureContext bootstraps once (keeping the admin token in the state) and
// writes the "local" CLI context.
func ensureContext(ctx context.Context, p Paths, st *State, say func(string, ...any)) error {
	tc, err := tlsConfig(p)
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", st.GRPCPort)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ac := v1.NewAuthServiceClient(conn)
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if st.AdminToken == "" {
		resp, err := ac.Authorize(metadata.AppendToOutgoingContext(cctx, "x-levers9-bootstrap-secret", st.BootstrapSecret), &v1.AuthorizeRequest{})
		if err != nil {
			return fmt.Errorf("bootstrap the first workspace: %w", err)
		}
		st.AdminToken = resp.Token
		say("bootstrapped workspace %q (%s)", resp.WorkspaceName, resp.WorkspaceId)
		if err := st.save(p); err != nil {
			return err
		}
	} else if _, err := ac.Authorize(metadata.AppendToOutgoingContext(cctx, "authorization", "Bearer "+st.AdminToken), &v1.AuthorizeRequest{}); err != nil {
		return fmt.Errorf("the saved admin token no longer works (%v): remove .levers9-dev to start over", err)
	}
	dir, err := cli.Dir(os.Getenv)
	if err != nil {
		return err
	}
	f, err := cli.LoadFile(dir)
	if errors.Is(err, cli.ErrNoConfig) {
		f, err = &cli.File{Contexts: map[string]cli.Context{}}, nil
	}
	if err != nil {
		return err
	}
	f.Contexts["local"] = cli.Context{Controlplane: addr, Token: st.AdminToken, TLS: true, CAFile: p.file("tls/cert.pem"),
		REST: fmt.Sprintf("127.0.0.1:%d", st.RESTPort)}
	if f.Current == "" {
		f.Current = "local"
	}
	if err := f.Save(dir); err != nil {
		return err
	}
	say("CLI context \"local\" saved in %s/config.toml", dir)
	if f.Current != "local" {
		say("your current context is %q; switch with: levers9 config use local", f.Current)
	}
	return nil
}
