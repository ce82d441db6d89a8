package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/levers9/levers9/agent/inventory"
	"github.com/levers9/levers9/agent/taskrun"
	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/tunnel"
)

// RunOptions configure a running agent.
type RunOptions struct {
	State   State
	Log     *slog.Logger
	Version string
	// TunnelAddrs override the addresses learnt at join (tests, moves).
	TunnelAddrs []string
	// HeartbeatInterval is how often the agent reports (default 10 s).
	HeartbeatInterval time.Duration
	// Inventory collects what the machine has; nil builds the real one.
	Inventory *inventory.Collector
	// RunscPath is the runsc whose version the real inventory reports
	// (default "runsc" on PATH); `levers9-agent run` passes the one its
	// node runs runsc pools with.
	RunscPath string
	// Client overrides tunnel settings (backoff, liveness) for tests.
	Client tunnel.ClientConfig
	// Egress, when the agent runs container networking, supplies the
	// pool's readiness report sent with each heartbeat.
	Egress ReadinessSource
	// Runner runs the attempts the controlplane sends; the agent owns it
	// from NewAgent on (Reconcile and Start in Start, Stop in Stop). Nil
	// makes an agent that refuses tasks (FailedPrecondition).
	Runner *taskrun.Runner
	// Report bounds attempt reports (buffers, batches, retries).
	Report ReportConfig
	// Clock times heartbeats and report retries and stamps reports
	// (default the wall clock). The tunnel's is Client.Clock.
	Clock clock.Clock
	// Seccomp attributes seccomp log-mode records to the attempts the
	// Runner runs (BuildNode makes it; nil: not attributed). The Node
	// owns it.
	Seccomp *SeccompWatch
	// Metrics is the agent's registry (default a fresh one): snapshots of
	// it go to the controlplane every MetricsInterval (default
	// DefaultMetricsInterval) unless a heartbeat answer names another.
	Metrics         *Metrics
	MetricsInterval time.Duration
	// Lease is how long the agent runs its attempts without reaching the
	// controlplane before it kills their containers (the controlplane
	// gives them up after controlplane.lostAgentGrace and retries them
	// elsewhere). Each heartbeat answer replaces it with the
	// controlplane's grace; this is the lease until the first answer
	// (default 30 s, the grace's default). Heartbeats go at least every
	// third of the lease.
	Lease time.Duration
	// Floor is the operator's --min-* flags: the loosest security this
	// machine runs. Settings left empty keep the floor saved in the state
	// directory (none at first).
	Floor enroll.Floor
	// Collect, when set, is the inventory each heartbeat reports instead
	// of this machine's (Inventory is then unused): an attached cluster's
	// agent reports its nodes. The agent adds the machine's labels. It is
	// called from the session loop only, never concurrently.
	Collect func(ctx context.Context) (*v1.Inventory, error)
	// Register, when set, registers further services the controlplane
	// calls on this agent's tunnel, beside the Agent service (an attached
	// cluster's ClusterAgent). Called once, from NewAgent.
	Register func(*grpc.Server)
}

// ReadinessSource is what the agent needs of the egress node.
type ReadinessSource interface {
	ReadinessReport(pool string) egress.Report
}

// Agent is a running agent: one tunnel kept up by tunnel.Auto, the agent API
// served on it, heartbeats with the inventory, certificate renewal.
type Agent struct {
	o        RunOptions
	settings Settings
	cert     atomic.Pointer[tls.Certificate]
	auto     *tunnel.Auto
	srv      *grpc.Server
	inv      *inventory.Collector
	// cp calls the controlplane on whatever session is up; attempt
	// reports use it so they outlive a reconnect.
	cp    *grpc.ClientConn
	tasks *tasks // nil without a Runner
	floor enroll.Floor
	// metricsEvery is the snapshot interval the controlplane asked for
	// (0: RunOptions.MetricsInterval).
	metricsEvery atomic.Int64
	// metricsWake tells the snapshot loop the interval changed.
	metricsWake chan struct{}
	metricsStop context.CancelFunc
	metricsDone chan struct{}
	// lease (a time.Duration) and contact (the clock's UnixNano of the
	// last heartbeat answer) drive the lease watchdog.
	lease   atomic.Int64
	contact atomic.Int64
	// gate holds RunTask back on each new session until its first
	// heartbeat answer is applied.
	gate *sessionGate
	// watchStop ends the watchdog; watchDone closes when it returned.
	watchStop chan struct{}
	watchDone chan struct{}
	watchOnce sync.Once
}

// NewAgent loads the state written by Join.
func NewAgent(o RunOptions) (*Agent, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = 10 * time.Second
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	if o.MetricsInterval <= 0 {
		o.MetricsInterval = DefaultMetricsInterval
	}
	if o.Lease == 0 {
		o.Lease = 30 * time.Second
	}
	if o.Lease < 0 {
		return nil, fmt.Errorf("--lease: %v is negative: %w", o.Lease, errdefs.ErrInvalidArgument)
	}
	o.Clock = clock.OrReal(o.Clock)
	st, err := o.State.Settings()
	if err != nil {
		return nil, err
	}
	a := &Agent{o: o, settings: st, metricsWake: make(chan struct{}, 1), watchStop: make(chan struct{}), watchDone: make(chan struct{})}
	a.lease.Store(int64(o.Lease))
	if a.floor, err = o.State.resolveFloor(o.Floor); err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(o.State.path("agent.crt"), o.State.path("agent.key"))
	if err != nil {
		return nil, fmt.Errorf("load the agent certificate from %s: %w", o.State.Dir, err)
	}
	a.cert.Store(&cert)
	caPEM, err := os.ReadFile(o.State.path("agent-ca.pem"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("agent-ca.pem holds no certificate")
	}
	a.inv = o.Inventory
	if a.inv == nil && o.Collect == nil {
		if a.inv, err = inventory.NewCollector(inventory.Config{StateDir: o.State.Dir, RunscPath: o.RunscPath, Logger: o.Log}); err != nil {
			return nil, err
		}
	}
	cc := o.Client
	cc.Addrs = st.TunnelAddrs
	if len(o.TunnelAddrs) > 0 {
		cc.Addrs = o.TunnelAddrs
	}
	cc.TLS = &tls.Config{
		RootCAs: pool,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return a.cert.Load(), nil
		},
	}
	cc.Logger = o.Log.With("component", "tunnel")
	if a.auto, err = tunnel.NewAuto(cc, a.onSession); err != nil {
		return nil, err
	}
	// Calls wait for a session (OpenStream blocks until one is up), so the
	// reconnect backoff of gRPC itself stays short.
	a.cp, err = tunnel.NewClientConn("controlplane", a.auto.OpenStream, tunnel.Limits{},
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6,
			Jitter: 0.2, MaxDelay: time.Second}, MinConnectTimeout: 20 * time.Second}))
	if err != nil {
		return nil, err
	}
	if o.Runner != nil {
		cp := agentv1.NewControlplaneClient(a.cp)
		send := func(ctx context.Context, req *agentv1.ReportAttemptRequest) (*agentv1.ReportAttemptResponse, error) {
			return cp.ReportAttempt(ctx, req, grpc.WaitForReady(true))
		}
		a.tasks = newTasks(o.Runner, send, o.Report, o.Clock, o.Log.With("component", "tasks", "machine_id", st.MachineID), st.Pool)
		a.tasks.floor = a.floor
		a.tasks.seccomp = o.Seccomp
		a.tasks.metrics = o.Metrics
		a.gate = newSessionGate(o.Clock)
		a.tasks.gate = a.gate
	}
	a.srv = grpc.NewServer(tunnel.ServerOptions(tunnel.Limits{})...)
	agentv1.RegisterAgentServer(a.srv, &agentService{machineID: st.MachineID, tasks: a.tasks})
	if o.Register != nil {
		o.Register(a.srv)
	}
	return a, nil
}

// MachineID is the machine this agent is.
func (a *Agent) MachineID() string { return a.settings.MachineID }

// Settings are what the agent learnt at join.
func (a *Agent) Settings() Settings { return a.settings }

// Controlplane calls the controlplane on whatever session is up (a call
// with grpc.WaitForReady waits for one); it lives until Stop.
func (a *Agent) Controlplane() agentv1.ControlplaneClient { return agentv1.NewControlplaneClient(a.cp) }

// Start goes on with the attempts an earlier agent left running (their
// containers outlive it: it reattaches their output and reports them
// running again), removes everything else it left (attempts whose
// container is gone are reported lost by their absence from the
// heartbeat), starts the Runner, and connects (and keeps reconnecting) in
// the background. ctx is the shutdown context: its end detaches running
// containers instead of killing them.
func (a *Agent) Start(ctx context.Context) error {
	if a.tasks != nil {
		found, lost, err := a.o.Runner.Recover(ctx)
		for _, l := range lost {
			a.o.Log.Warn("attempt lost by an earlier agent: its container is gone", "task_id", l.TaskID, "attempt", l.Attempt,
				"pool", l.Pool, "container_id", l.ContainerID, "started", l.Started)
		}
		if err != nil {
			a.o.Log.Error("reconcile leftovers of an earlier agent", "err", err)
		}
		if err := a.o.Runner.Start(ctx); err != nil {
			return err
		}
		a.tasks.start(ctx)
		a.contact.Store(a.o.Clock.Now().UnixNano())
		go a.watchLease()
		for _, rc := range found {
			// Held before the first heartbeat, so the controlplane sees
			// them still running.
			if err := a.tasks.resume(rc); err != nil {
				a.o.Log.Error("could not resume an attempt an earlier agent left running", "task_id", rc.Task.ID,
					"attempt", rc.Task.Attempt, "pool", rc.Task.Pool, "err", err)
			}
		}
	}
	a.cp.Connect()
	if err := a.auto.Start(ctx); err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.metricsStop, a.metricsDone = cancel, make(chan struct{})
	go func() {
		defer close(a.metricsDone)
		a.sendMetrics(mctx)
	}()
	return nil
}

// Stop closes the tunnel and waits; running containers detach (see
// taskrun). Safe twice.
func (a *Agent) Stop() {
	if a.metricsStop != nil {
		a.metricsStop()
		<-a.metricsDone
	}
	a.watchOnce.Do(func() { close(a.watchStop) })
	if a.tasks != nil && a.contact.Load() != 0 {
		<-a.watchDone
	}
	a.auto.Stop()
	a.srv.Stop()
	if a.tasks != nil {
		a.tasks.stop()
	}
	_ = a.cp.Close()
}

func (a *Agent) onSession(ctx context.Context, s tunnel.Session) {
	if a.gate != nil {
		// Closed before the Agent service is served on this session.
		a.gate.close()
	}
	a.o.Log.Info("connected to the controlplane", "machine_id", a.settings.MachineID, "transport", s.Transport())
	go tunnel.ServeGRPC(ctx, s, a.srv)
	up := a.o.Metrics.TunnelConnected.WithLabelValues(string(s.Transport()))
	up.Set(1)
	defer up.Set(0)
	a.o.Metrics.TunnelSessions.Inc()
	conn, err := tunnel.NewClientConn("controlplane", s.OpenStream, tunnel.Limits{})
	if err != nil {
		a.o.Log.Error("controlplane connection", "err", err)
		return
	}
	defer conn.Close()
	cp := agentv1.NewControlplaneClient(conn)
	var lastInv *v1.Inventory
	ready := false // the gate opened on this session
	lastInvSent := time.Time{}
	for {
		req := &agentv1.HeartbeatRequest{AgentVersion: a.o.Version, SentAt: timestamppb.New(a.o.Clock.Now())}
		inv := a.collect(ctx)
		// The inventory goes with the first heartbeat of a session, when it
		// changed, and at least every few minutes.
		if lastInv == nil || !proto.Equal(inv, lastInv) || a.o.Clock.Since(lastInvSent) > 5*time.Minute {
			req.Inventory = inv
		}
		if a.o.Egress != nil {
			req.EgressReport = reportPB(a.o.Egress.ReadinessReport(a.settings.Pool))
		}
		if a.tasks != nil {
			req.Running = a.tasks.list()
		}
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := cp.Heartbeat(hctx, req)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			a.o.Log.Warn("heartbeat failed", "err", err)
		case err == nil:
			a.contact.Store(a.o.Clock.Now().UnixNano())
			if resp.LeaseSeconds > 0 {
				a.lease.Store(int64(time.Duration(resp.LeaseSeconds) * time.Second))
			}
			if req.Inventory != nil {
				lastInv, lastInvSent = inv, a.o.Clock.Now()
			}
			if a.tasks != nil {
				ended := a.tasks.stopAll(resp.Stop, "stopped by the controlplane")
				if a.gate != nil && !ready {
					a.openGate(ctx, ended)
					ready = true
				}
			}
			a.setMetricsInterval(time.Duration(resp.MetricsIntervalSeconds) * time.Second)
			if resp.RenewCertificate {
				a.renew(ctx, cp)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.Done():
			return
		case <-a.o.Clock.After(min(a.o.HeartbeatInterval, time.Duration(a.lease.Load())/3)):
		}
	}
}

// openGate opens the session's gate once the attempts the heartbeat
// answer stopped have ended (bounded by stopWait and ctx), so no new
// container starts beside one the controlplane gave up.
func (a *Agent) openGate(ctx context.Context, ended []<-chan struct{}) {
	if len(ended) > 0 {
		t := a.o.Clock.NewTimer(stopWait)
		defer t.Stop()
	wait:
		for _, ch := range ended {
			select {
			case <-ch:
			case <-ctx.Done():
				return
			case <-t.C():
				a.o.Log.Warn("attempts stopped by the controlplane are still ending; taking new ones anyway",
					"machine_id", a.settings.MachineID, "wait", stopWait.String())
				break wait
			}
		}
	}
	a.gate.openUp()
}

// watchLease kills the containers of every held attempt once the agent
// has not reached the controlplane for longer than its lease: by then the
// controlplane has given them up and may run them elsewhere, and one
// attempt must never run twice at once. Attempts the controlplane still
// counts as this agent's are not affected while heartbeats get answers.
func (a *Agent) watchLease() {
	defer close(a.watchDone)
	t := a.o.Clock.NewTicker(time.Second)
	defer t.Stop()
	expired := false
	for {
		select {
		case <-a.watchStop:
			return
		case <-t.C():
		}
		lease := time.Duration(a.lease.Load())
		away := a.o.Clock.Now().Sub(time.Unix(0, a.contact.Load()))
		if away <= lease {
			expired = false
			continue
		}
		n := a.tasks.loseAll(fmt.Sprintf("killed by this machine's agent: no contact with the controlplane for %s, longer than its lease of %s", away.Round(time.Second), lease))
		if n > 0 || !expired {
			a.o.Log.Warn("lease expired: the controlplane gives up this machine's attempts; killing their containers",
				"machine_id", a.settings.MachineID, "away", away.Round(time.Second).String(), "lease", lease.String(), "attempts", n)
		}
		expired = true
	}
}

func (a *Agent) collect(ctx context.Context) *v1.Inventory {
	if a.o.Collect != nil {
		pb, err := a.o.Collect(ctx)
		if err != nil && ctx.Err() == nil {
			a.o.Log.Warn("inventory incomplete", "err", err)
		}
		if pb == nil {
			pb = &v1.Inventory{}
		}
		pb.Labels = a.settings.Labels
		return pb
	}
	inv, err := a.inv.Collect(ctx)
	if err != nil && ctx.Err() == nil {
		a.o.Log.Debug("inventory incomplete", "err", err)
	}
	pb := &v1.Inventory{Hostname: inv.Hostname, Os: inv.OS, Arch: inv.Arch, Kernel: inv.KernelRelease,
		Cpus: int32(inv.CPU.Count), CpuModel: inv.CPU.Model, MemoryBytes: inv.MemoryTotalBytes,
		DiskBytes: inv.Disk.TotalBytes, RuncVersion: inv.RuncVersion, RunscVersion: inv.RunscVersion,
		Apparmor: inv.AppArmorEnabled, Labels: a.settings.Labels}
	for _, g := range inv.GPUs {
		pb.Gpus = append(pb.Gpus, &v1.Gpu{Index: int32(g.Index), Uuid: g.UUID, Name: g.Name, MemoryBytes: g.MemoryTotalBytes,
			DriverVersion: g.DriverVersion, CudaVersion: g.CUDADriverVersion})
	}
	// Free disk changes every second; report it rounded so the inventory
	// does not count as changed at every heartbeat.
	pb.DiskFreeBytes = inv.Disk.FreeBytes &^ (1<<30 - 1)
	return pb
}

// renew replaces the certificate with one for a fresh key.
func (a *Agent) renew(ctx context.Context, cp agentv1.ControlplaneClient) {
	keyPEM, csrPEM, err := enroll.NewKeyAndCSR(a.settings.MachineID)
	if err != nil {
		a.o.Log.Error("certificate renewal: make key", "err", err)
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	resp, err := cp.RenewCertificate(rctx, &agentv1.RenewCertificateRequest{CsrPem: string(csrPEM)})
	if err != nil {
		a.o.Log.Warn("certificate renewal failed; will retry", "err", err)
		return
	}
	cert, err := tls.X509KeyPair([]byte(resp.CertificatePem), keyPEM)
	if err != nil {
		a.o.Log.Error("certificate renewal: the controlplane returned a certificate for another key", "err", err)
		return
	}
	if err := enroll.WriteSecretFile(a.o.State.path("agent.key.new"), keyPEM); err != nil {
		a.o.Log.Error("certificate renewal: save key", "err", err)
		return
	}
	if err := enroll.WriteSecretFile(a.o.State.path("agent.crt.new"), []byte(resp.CertificatePem)); err != nil {
		a.o.Log.Error("certificate renewal: save certificate", "err", err)
		return
	}
	// Key first, then certificate: a crash between the renames leaves a
	// pair that fails to load, and the .new files to recover from.
	if err := os.Rename(a.o.State.path("agent.key.new"), a.o.State.path("agent.key")); err != nil {
		a.o.Log.Error("certificate renewal: install key", "err", err)
		return
	}
	if err := os.Rename(a.o.State.path("agent.crt.new"), a.o.State.path("agent.crt")); err != nil {
		a.o.Log.Error("certificate renewal: install certificate", "err", err)
		return
	}
	a.cert.Store(&cert)
	a.o.Log.Info("certificate renewed", "expires", resp.ExpiresAt.AsTime())
}

func reportPB(r egress.Report) *v1.ReadinessReport {
	pb := &v1.ReadinessReport{Pool: r.Pool, Mode: string(r.Mode), Total: r.Total, SafeToEnforce: r.SafeToEnforce, Blind: r.Blind}
	if !r.From.IsZero() {
		pb.From = timestamppb.New(r.From)
	}
	if !r.To.IsZero() {
		pb.To = timestamppb.New(r.To)
	}
	for _, c := range r.ByClass {
		pb.ByClass = append(pb.ByClass, &v1.EgressClassCount{Class: c.Class, Count: c.Count})
	}
	for _, t := range r.ByTask {
		pb.ByTask = append(pb.ByTask, &v1.EgressTaskCount{Task: t.Task, Class: t.Class, Count: t.Count})
	}
	for _, d := range r.Destinations {
		pb.Destinations = append(pb.Destinations, &v1.EgressDestination{Class: d.Class, Destination: d.Destination, Task: d.Task, Samples: d.Samples})
	}
	return pb
}

func runCmd(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stateDir := fs.String("state-dir", "/var/lib/levers9-agent", "the agent's state directory (from join)")
	tunnelAddr := fs.String("tunnel", "", "controlplane tunnel HOST:PORT (default: learnt at join)")
	var nc NodeConfig
	fs.StringVar(&nc.Prefix, "prefix", "", "names this agent's containers, cgroups, bridge and namespaces (default: from the machine ID)")
	fs.StringVar(&nc.ImageRegistry, "image-registry", "", "worker.imageRegistry: where images without a registry come from (default index.docker.io)")
	registries := fs.String("registries", "", "further registries images may name, comma-separated")
	insecure := fs.String("insecure-registries", "", "registries reached over plain HTTP, comma-separated (e.g. a local 127.0.0.1:5000)")
	fs.Int64Var(&nc.ImageDiskBudget, "image-disk-budget", 0, "cap of the image cache in bytes (0: no eviction)")
	fs.BoolVar(&nc.NoNetwork, "no-network", false, "run containers with loopback only (no egress network)")
	fs.StringVar(&nc.SubnetV4, "subnet-v4", "", "container IPv4 subnet (default: a free /"+strconv.Itoa(egress.DefaultHostBitsV4)+" of --subnet-pool-v4)")
	fs.StringVar(&nc.SubnetV6, "subnet-v6", "", "container IPv6 ULA subnet (default: a free /64 of --subnet-pool-v6)")
	fs.StringVar(&nc.HostNet.PoolV4, "subnet-pool-v4", "", "where agents on this host get their IPv4 subnets (default "+egress.DefaultHostPoolV4+")")
	fs.StringVar(&nc.HostNet.PoolV6, "subnet-pool-v6", "", "where agents on this host get their IPv6 subnets (default "+egress.DefaultHostPoolV6+")")
	fs.StringVar(&nc.HostNet.Dir, "host-net-dir", "", "the host-wide claims of agents' subnets and NFLOG groups (default "+egress.DefaultHostDir+")")
	fs.Func("nflog-group", "netlink log group of the egress chains; each agent on a host needs its own (default: a free one from "+strconv.Itoa(egress.DefaultNFLOGFirst)+")", func(v string) error {
		g, err := strconv.ParseUint(v, 10, 16)
		if err != nil || g == 0 {
			return fmt.Errorf("%q is not a group number in 1..65535", v)
		}
		nc.NFLOGGroup = uint16(g)
		return nil
	})
	resolvers := fs.String("resolvers", "", "DNS servers containers use, comma-separated (default: the host's non-loopback ones)")
	var floor enroll.Floor
	fs.StringVar(&floor.Profile, "min-profile", "", "refuse tasks whose profile is below this: legacy < hardened (default: the saved floor, else none)")
	fs.StringVar(&floor.Seccomp, "min-seccomp", "", "refuse tasks whose seccomp is below this: off < log < enforce (default: the saved floor, else none)")
	fs.StringVar(&floor.Egress, "min-egress", "", "refuse tasks whose egress mode is below this: observe < enforce (default: the saved floor, else none)")
	metricsEvery := fs.Duration("metrics-interval", DefaultMetricsInterval, "how often to send a metrics snapshot to the controlplane (unless it asks for another interval: controlplane.metrics.workerInterval)")
	lease := fs.Duration("lease", 0, "how long tasks run without reaching the controlplane before their containers are killed, until the controlplane says its controlplane.lostAgentGrace (default 30s)")
	fs.StringVar(&nc.GPURoot, "gpu-root", "", "where the NVIDIA driver's /proc/driver/nvidia and /dev/nvidia* are (default /)")
	exitIdle := fs.Duration("exit-when-idle", 0, "exit (status 0) once no task has run for this long (0: never); worker pods of Kubernetes pools set it")
	fs.StringVar(&nc.WeedPath, "weed", "", "the SeaweedFS weed binary that mounts seaweedfs volumes (default $LEVERS9_WEED_BIN, else weed on PATH)")
	fs.StringVar(&nc.RunscPath, "runsc", "", "the runsc binary runsc pools run with (default: "+PinnedRunsc+" when installed, else runsc on PATH)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := floor.Validate(); err != nil {
		return err
	}
	if *metricsEvery < time.Second {
		return fmt.Errorf("--metrics-interval: %s is below 1s: %w", *metricsEvery, errdefs.ErrInvalidArgument)
	}
	if nc.RunscPath != "" {
		if _, err := exec.LookPath(nc.RunscPath); err != nil {
			return fmt.Errorf("--runsc: %w: %w", err, errdefs.ErrInvalidArgument)
		}
	}
	nc.Registries, nc.InsecureRegistries, nc.Resolvers = splitList(*registries), splitList(*insecure), splitList(*resolvers)
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	o := RunOptions{State: State{Dir: *stateDir}, Log: log, Version: reportedVersion(), Floor: floor,
		Metrics: NewMetrics(), MetricsInterval: *metricsEvery, Lease: *lease}
	if *tunnelAddr != "" {
		o.TunnelAddrs = []string{*tunnelAddr}
	}
	st, err := o.State.Settings()
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(*stateDir)
	if err != nil {
		return err
	}
	nc.StateDir, nc.MachineID, nc.Logger, nc.Metrics = abs, st.MachineID, log, o.Metrics
	nc.Controlplane = controlplaneAllow(st.Controlplane)
	nc.RunscPath = nc.WithDefaults().RunscPath
	o.RunscPath = nc.RunscPath
	node, err := BuildNode(ctx, nc)
	if err != nil {
		return fmt.Errorf("build the task runner: %w", err)
	}
	defer node.Close()
	o.Runner, o.Egress, o.Seccomp = node.Runner, node.Readiness(), node.Seccomp
	a, err := NewAgent(o)
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		a.Stop()
		return err
	}
	log.Info("agent running", "machine_id", a.MachineID(), "pool", a.settings.Pool, "prefix", nc.WithDefaults().Prefix, "runsc", nc.RunscPath, "floor", a.floor.String(), "version", o.Version)
	if *exitIdle < 0 {
		a.Stop()
		return fmt.Errorf("--exit-when-idle: %s is negative: %w", *exitIdle, errdefs.ErrInvalidArgument)
	}
	if *exitIdle > 0 {
		if idle := a.WaitIdle(ctx, *exitIdle); idle > 0 {
			log.Info("exiting: idle", "machine_id", a.MachineID(), "idle", idle.Round(time.Millisecond).String())
			a.Stop()
			return nil
		}
	}
	<-ctx.Done()
	a.Stop()
	return nil
}

// WaitIdle blocks until the agent has held no attempt for d, and returns
// how long it had been idle; 0 when ctx ended first (or the agent runs no
// tasks).
func (a *Agent) WaitIdle(ctx context.Context, d time.Duration) time.Duration {
	if a.tasks == nil {
		return 0
	}
	step := min(max(d/10, 10*time.Millisecond), time.Second)
	t := a.o.Clock.NewTicker(step)
	defer t.Stop()
	for {
		if idle := a.tasks.idleFor(); idle >= d {
			return idle
		}
		select {
		case <-ctx.Done():
			return 0
		case <-t.C():
		}
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
