// Command tasks benchmarks levers9's task path end to end on this machine:
// submit-to-first-output-line of a trivial task through the controlplane
// (queue, scheduler, tunnel push), an agent (cached image, sandbox, runc)
// and the report path back to a follower, against a bare `runc run` of an
// equivalent bundle and a `podman run` of the same image measured in the
// same run (the bare runc bundle is the agent's own hardened spec), plus the
// throughput of trivial tasks with two agents.
//
// The stack is real and private: Postgres, Redis and a docker-registry on
// free loopback ports under a temporary directory, the controlplane and two
// agents in this process. Containers run without the egress network on all
// three sides (podman --network none): two agents in one network namespace
// would share a bridge subnet, and the host's own FORWARD chain is not the
// benchmark's to change. Its last line is
//
//	overhead_ms_p50=… overhead_ms_p99=… vs_podman=… tasks_per_s=…
//
// overhead_ms_* is levers9's first-line latency minus bare runc's at that
// percentile; vs_podman the ratio of medians (levers9 / podman). Needs root.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/levers9/levers9/agent"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/server"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image/build"
)

func main() {
	quick := flag.Bool("quick", false, "10 latency rounds and 20 throughput tasks (about a minute)")
	rounds := flag.Int("n", 40, "latency rounds")
	burst := flag.Int("tasks", 60, "tasks in the throughput burst")
	flag.Parse()
	if *quick {
		*rounds, *burst = 10, 20
	}
	if err := run(*rounds, *burst); err != nil {
		log.Fatal(err)
	}
}

type stack struct {
	work  string
	reg   *devstack.Registry
	image string
	srv   *server.Server
	conn  *grpc.ClientConn
	ctx   context.Context // carries the admin token
	tasks v1.TaskServiceClient
	stops []func()
}

func (s *stack) close() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
}

func run(rounds, burst int) error {
	ctx := context.Background()
	s := &stack{}
	defer s.close()
	if err := s.up(ctx); err != nil {
		return err
	}
	runcFirst, err := s.bareBundle(ctx)
	if err != nil {
		return err
	}
	podmanFirst, err := s.podman()
	if err != nil {
		return err
	}
	// Warm every agent's image cache and the paths.
	for i := 0; i < 4; i++ {
		if _, err := s.firstLine(); err != nil {
			return fmt.Errorf("warm-up task: %w", err)
		}
	}
	var l9, bare, pod []time.Duration
	for r := 0; r < rounds; r++ {
		order := []string{"levers9", "runc", "podman"}
		if r%2 == 1 {
			order = []string{"podman", "runc", "levers9"}
		}
		for _, which := range order {
			var d time.Duration
			var err error
			switch which {
			case "levers9":
				d, err = s.firstLine()
				l9 = append(l9, d)
			case "runc":
				d, err = runcFirst(r)
				bare = append(bare, d)
			case "podman":
				d, err = podmanFirst(r)
				pod = append(pod, d)
			}
			if err != nil {
				return fmt.Errorf("%s round %d: %w", which, r, err)
			}
		}
	}
	perSec, err := s.throughput(burst)
	if err != nil {
		return err
	}
	for _, x := range []struct {
		name string
		d    []time.Duration
	}{{"levers9", l9}, {"bare runc", bare}, {"podman", pod}} {
		fmt.Printf("%-10s first line p50 %v p99 %v over %d runs\n", x.name, pct(x.d, 50), pct(x.d, 99), len(x.d))
	}
	fmt.Printf("throughput: %d trivial tasks on 2 agents at %.1f tasks/s\n", burst, perSec)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	fmt.Printf("overhead_ms_p50=%.1f overhead_ms_p99=%.1f vs_podman=%.3f tasks_per_s=%.1f\n",
		ms(pct(l9, 50)-pct(bare, 50)), ms(pct(l9, 99)-pct(bare, 99)), float64(pct(l9, 50))/float64(pct(pod, 50)), perSec)
	return nil
}

func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}

// up starts Postgres, Redis, the registry with the image, the controlplane
// and two joined agents.
// up starts the stack: Postgres, Redis, a registry holding the bench
// image, a controlplane with TLS, and two agents, online.
func (s *stack) up(ctx context.Context) error {
	var err error
	if s.work, err = os.MkdirTemp("", "l9t-bench-"); err != nil {
		return err
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
	certPEM, certFile, keyFile, err := s.writeCert()
	if err != nil {
		return err
	}
	cfg, err := s.controlplaneConfig(pg, rd, certFile, keyFile)
	if err != nil {
		return err
	}
	if err := s.startControlplane(ctx, cfg, certPEM); err != nil {
		return err
	}
	return s.startAgents(ctx, certFile)
}

// startServices starts Postgres, Redis and a registry under s.work and
// pushes the bench image.
func (s *stack) startServices(ctx context.Context) (*devstack.Postgres, *devstack.Redis, error) {
	pg, err := devstack.StartPostgres(ctx, filepath.Join(s.work, "pg"), devstack.PostgresOptions{User: "levers9", Password: "bench"})
	if err != nil {
		return nil, nil, err
	}
	s.stops = append(s.stops, func() { _ = pg.Stop() })
	if err := pg.CreateDatabase(ctx, "levers9"); err != nil {
		return nil, nil, err
	}
	rd, err := devstack.StartRedis(ctx, filepath.Join(s.work, "redis"), 0, "")
	if err != nil {
		return nil, nil, err
	}
	s.stops = append(s.stops, func() { _ = rd.Stop() })
	if s.reg, err = devstack.StartRegistry(ctx, filepath.Join(s.work, "registry"), "", 0); err != nil {
		return nil, nil, err
	}
	s.stops = append(s.stops, func() { _ = s.reg.Stop() })
	res, err := build.BuildBusybox(ctx, s.reg.Addr(), "levers9/bench", "v1", nil, build.Options{})
	if err != nil {
		return nil, nil, err
	}
	s.image = res.Ref

	return pg, rd, nil
}

// writeCert writes a self-signed certificate for 127.0.0.1 and its key.
func (s *stack) writeCert() (certPEM []byte, certFile, keyFile string, err error) {
	certPEM, keyPEM, err := devstack.SelfSignedCert("levers9 bench", time.Hour, "127.0.0.1")
	if err != nil {
		return nil, "", "", err
	}
	certFile, keyFile = filepath.Join(s.work, "cert.pem"), filepath.Join(s.work, "key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return nil, "", "", err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return nil, "", "", err
	}
	return certPEM, certFile, keyFile, nil
}

// controlplaneConfig is a validated config on free ports, with TLS and a
// bootstrap secret, pointing at the stack's services.
func (s *stack) controlplaneConfig(pg *devstack.Postgres, rd *devstack.Redis, certFile, keyFile string) (*config.Config, error) {
	var err error
	cfg := &config.Config{}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = devstack.FreeTCPUDPPort(); err != nil {
			return nil, err
		}
	}
	cfg.Controlplane.GRPCAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	cfg.Controlplane.RESTAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
	cfg.Controlplane.TunnelAddr = fmt.Sprintf("127.0.0.1:%d", ports[2])
	cfg.Controlplane.Metrics.Addr = "127.0.0.1:0"
	cfg.Controlplane.TLS.CertFile, cfg.Controlplane.TLS.KeyFile = certFile, keyFile
	cfg.Controlplane.Auth.BootstrapSecret = "bench-bootstrap-secret-0123456789abcdef"
	cfg.Controlplane.LogLevel = "warn"
	cfg.Controlplane.AgentBinariesDir = s.work
	if err := os.WriteFile(filepath.Join(s.work, "levers9-agent-linux-amd64"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		return nil, err
	}
	p := &cfg.Database.Postgres
	p.Host, p.Port, p.User, p.Password, p.Database = pg.Host, pg.Port, "levers9", "bench", "levers9"
	p.EncryptionKey = "bench-encryption-key-aaaaaaaaaaaa"
	cfg.Database.Redis.Addr = rd.Addr()
	cfg.Worker.DefaultImage = s.image
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
	for deadline := time.Now().Add(60 * time.Second); !s.srv.Healthy() || s.srv.Agents() == nil; {
		if time.Now().After(deadline) {
			return errors.New("controlplane not healthy within 60 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	tc, err := credentialsFor(certPEM)
	if err != nil {
		return err
	}
	if s.conn, err = grpc.NewClient(s.srv.GRPCAddr(), grpc.WithTransportCredentials(tc)); err != nil {
		return err
	}
	s.stops = append(s.stops, func() { s.conn.Close() })
	auth, err := v1.NewAuthServiceClient(s.conn).Authorize(metadata.AppendToOutgoingContext(ctx, "x-levers9-bootstrap-secret", "bench-bootstrap-secret-0123456789abcdef"), &v1.AuthorizeRequest{})
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	s.ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.Token)
	s.tasks = v1.NewTaskServiceClient(s.conn)
	return nil
}

// startAgents joins two agents and waits until both are online with an
// inventory.
func (s *stack) startAgents(ctx context.Context, certFile string) error {
	for i := 0; i < 2; i++ {
		if err := s.joinAgent(ctx, i, certFile); err != nil {
			return fmt.Errorf("agent %d: %w", i, err)
		}
	}
	machines := v1.NewMachineServiceClient(s.conn)
	for deadline := time.Now().Add(60 * time.Second); ; {
		r, err := machines.ListMachines(s.ctx, &v1.ListMachinesRequest{})
		online := 0
		if err == nil {
			for _, m := range r.Machines {
				if m.State == v1.MachineState_MACHINE_STATE_ONLINE && m.GetInventory().GetCpus() > 0 {
					online++
				}
			}
		}
		if online == 2 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("agents not online within 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *stack) joinAgent(ctx context.Context, i int, caFile string) error {
	created, err := v1.NewMachineServiceClient(s.conn).CreateMachine(s.ctx, &v1.CreateMachineRequest{Pool: "default", Name: fmt.Sprintf("bench-%d", i)})
	if err != nil {
		return err
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
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := agent.BuildNode(ctx, agent.NodeConfig{StateDir: state.Dir, MachineID: st.MachineID, Prefix: fmt.Sprintf("l9tb%d", i),
		NoNetwork: true, InsecureRegistries: []string{s.reg.Addr()}, Logger: quiet})
	if err != nil {
		return err
	}
	a, err := agent.NewAgent(agent.RunOptions{State: state, Log: quiet, Version: "bench", Runner: node.Runner, HeartbeatInterval: time.Second})
	if err != nil {
		node.Close()
		return err
	}
	if err := a.Start(ctx); err != nil {
		return err
	}
	s.stops = append(s.stops, func() { a.Stop(); node.Close() })
	return nil
}

func credentialsFor(caPEM []byte) (credentials.TransportCredentials, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no certificate in the bench's CA")
	}
	return credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}), nil
}

// firstLine submits `echo hi` and returns the time until its first output
// line reached a follower; it then waits for the task's end.
func (s *stack) firstLine() (time.Duration, error) {
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	start := time.Now()
	sub, err := s.tasks.SubmitTask(ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: []string{"echo", "hi"}}})
	if err != nil {
		return 0, err
	}
	st, err := s.tasks.FollowTask(ctx, &v1.FollowTaskRequest{Id: sub.Task.Id})
	if err != nil {
		return 0, err
	}
	var first time.Duration
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
		if ev.GetLog() != nil && first == 0 {
			first = time.Since(start)
		}
		if sc := ev.GetState(); sc != nil && sc.TaskState == v1.TaskState_TASK_STATE_FAILED {
			return 0, fmt.Errorf("task %s failed: %s", sub.Task.Id, sc.Message)
		}
	}
	if first == 0 {
		return 0, fmt.Errorf("task %s printed nothing", sub.Task.Id)
	}
	return first, nil
}

// throughput runs n trivial tasks at once and returns tasks per second
// from the first submit to the last end.
func (s *stack) throughput(n int) (float64, error) {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.firstLine(); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// bareBundle writes the very bundle the agent's sandbox would run for the
// same command (busybox rootfs, the default pool's hardened spec with its
// seccomp profile) and returns a runner timing `runc run` of it to its first
// output line: the difference is levers9's own cost, not hardening's.
func (s *stack) bareBundle(ctx context.Context) (func(int) (time.Duration, error), error) {
	bundle := filepath.Join(s.work, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return nil, err
		}
	}
	bb, err := os.ReadFile(build.DefaultBusybox)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin/busybox"), bb, 0o755); err != nil {
		return nil, err
	}
	if err := os.Symlink("busybox", filepath.Join(rootfs, "bin/echo")); err != nil {
		return nil, err
	}
	host, err := sandbox.DetectHost(ctx, sandbox.NVIDIADiscovery{})
	if err != nil {
		return nil, err
	}
	sec := sandbox.Security{Profile: sandbox.ProfileHardened, Seccomp: sandbox.SeccompEnforce, DropNetRaw: true}
	spec, _, err := sandbox.BuildSpec(sandbox.TaskSpec{ID: "bare", Rootfs: rootfs, Args: []string{"/bin/echo", "hi"}}, sec.WithDefaults(), host)
	if err != nil {
		return nil, err
	}
	spec.Linux.CgroupsPath = "/l9tb-bare"
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return nil, err
	}
	root := filepath.Join(s.work, "runc-root")
	return func(i int) (time.Duration, error) {
		return timeFirstLine(exec.Command("runc", "--root", root, "run", "--bundle", bundle, fmt.Sprintf("l9tb-bare-%d", i)))
	}, nil
}

// podman pulls the image once and returns a runner timing `podman run` of
// it to its first output line.
func (s *stack) podman() (func(int) (time.Duration, error), error) {
	dir := filepath.Join(s.work, "podman")
	pm := func(args ...string) *exec.Cmd {
		return exec.Command("podman", append([]string{"--root", dir + "/root", "--runroot", dir + "/runroot",
			"--cgroup-manager=cgroupfs", "--events-backend=file"}, args...)...)
	}
	if out, err := pm("pull", "--tls-verify=false", s.image).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("podman pull: %w: %s", err, out)
	}
	s.stops = append(s.stops, func() { _ = pm("rm", "-a", "-f").Run() })
	return func(i int) (time.Duration, error) {
		d, err := timeFirstLine(pm("run", "--name", fmt.Sprintf("l9tb-pod-%d", i), "--network", "none",
			"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", s.image, "echo", "hi"))
		_ = pm("rm", "-f", fmt.Sprintf("l9tb-pod-%d", i)).Run()
		return d, err
	}, nil
}

// timeFirstLine runs cmd and returns the time to its first stdout line.
func timeFirstLine(cmd *exec.Cmd) (time.Duration, error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	first := time.Since(start)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("%s: %w: %s", cmd.Args[0], err, stderr.String())
	}
	if n == 0 {
		return 0, fmt.Errorf("%s printed nothing", cmd.Args[0])
	}
	return first, nil
}
