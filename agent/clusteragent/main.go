package clusteragent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/levers9/levers9/agent"
	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// Config configures a cluster agent.
type Config struct {
	// StateDir is the state `levers9-agent join` wrote.
	StateDir string
	// Namespace is where its worker Jobs live (the manifest's).
	Namespace string
	// Pool must be the pool the agent joined.
	Pool string
	// Kube is the agent's own API server.
	Kube kubernetes.Interface
	// WorkerImage replaces the image the controlplane sends (the image
	// this agent runs, from the manifest); empty keeps the sent one.
	WorkerImage string
	// CAFile is the controlplane's CA the workers join with (the mounted
	// join Secret's ca.crt); empty uses the one the controlplane sends.
	CAFile string
	// WorkerNodeSelector and WorkerPodAnnotations go on every worker pod
	// (added to what the controlplane sends): where workers run in this
	// cluster is its operator's choice, which the controlplane cannot
	// know (a GPU node group, a scheduler's annotations).
	WorkerNodeSelector, WorkerPodAnnotations map[string]string
	// TunnelAddrs override the tunnel addresses learnt at join.
	TunnelAddrs []string
	Log         *slog.Logger
	// Agent overrides further agent options (tests: heartbeat, backoff).
	Agent agent.RunOptions
}

// Agent is a running cluster agent. Start/Stop follow the start-stop
// contract: Start returns once the tunnel loop and the pod watch run,
// Stop waits for both and is safe twice or before Start.
type Agent struct {
	cfg   Config
	agent *agent.Agent
	watch *kubeworkers.Watcher
	jobs  *kubeworkers.Client
	// stopWatch ends the reporter of pod-gone events; done closes after.
	stopWatch context.CancelFunc
	done      chan struct{}
}

// New loads the joined state and builds the agent; nothing runs until
// Start.
func New(cfg Config) (*Agent, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Kube == nil || cfg.Namespace == "" || cfg.Pool == "" {
		return nil, fmt.Errorf("cluster agent: Kube, Namespace and Pool are required: %w", errdefs.ErrInvalidArgument)
	}
	st, err := (agent.State{Dir: cfg.StateDir}).Settings()
	if err != nil {
		return nil, fmt.Errorf("reading the cluster agent's state in %s: %w", cfg.StateDir, err)
	}
	if st.Pool != cfg.Pool {
		return nil, fmt.Errorf("--pool %s: this agent joined pool %s: %w", cfg.Pool, st.Pool, errdefs.ErrInvalidArgument)
	}
	a := &Agent{cfg: cfg, jobs: kubeworkers.New(cfg.Kube, cfg.Namespace)}
	svc := &service{jobs: a.jobs, pool: cfg.Pool, image: cfg.WorkerImage, controlplane: st.Controlplane, caFile: cfg.CAFile,
		nodeSelector: cfg.WorkerNodeSelector, podAnnotations: cfg.WorkerPodAnnotations,
		log: cfg.Log.With("component", "cluster", "machine_id", st.MachineID)}
	o := cfg.Agent
	o.State, o.Log, o.TunnelAddrs = agent.State{Dir: cfg.StateDir}, cfg.Log, cfg.TunnelAddrs
	if o.Version == "" {
		o.Version = agent.ReportedVersion()
	}
	o.Runner = nil // it runs no task itself
	o.Collect = func(ctx context.Context) (*v1.Inventory, error) {
		inv, err := Nodes(ctx, cfg.Kube)
		if inv != nil {
			inv.Hostname = "cluster/" + cfg.Namespace
		}
		return inv, err
	}
	o.Register = func(s *grpc.Server) { agentv1.RegisterClusterAgentServer(s, svc) }
	if a.agent, err = agent.NewAgent(o); err != nil {
		return nil, err
	}
	return a, nil
}

// MachineID is the cluster agent's machine.
func (a *Agent) MachineID() string { return a.agent.MachineID() }

// Start watches the pool's worker pods (returning once they are listed)
// and connects in the background.
func (a *Agent) Start(ctx context.Context) error {
	log := a.cfg.Log.With("component", "cluster", "machine_id", a.agent.MachineID(), "pool", a.cfg.Pool)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	events := make(chan kubeworkers.PodGone, 256)
	a.watch = a.jobs.Watch(a.cfg.Pool, func(g kubeworkers.PodGone) {
		select {
		case events <- g:
		case <-rctx.Done():
		}
	})
	// Bounded: an API server out of reach fails the pod (and its restart
	// tries again) rather than leaving an agent that says nothing.
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	err := a.watch.Start(wctx)
	wcancel()
	if err != nil {
		cancel()
		return fmt.Errorf("watching the worker pods of pool %s in namespace %s: %w", a.cfg.Pool, a.cfg.Namespace, err)
	}
	if err := a.agent.Start(ctx); err != nil {
		cancel()
		a.watch.Stop()
		return err
	}
	a.stopWatch, a.done = cancel, make(chan struct{})
	go func() {
		defer close(a.done)
		cp := a.agent.Controlplane()
		for {
			select {
			case <-rctx.Done():
				return
			case g := <-events:
				report(rctx, cp, g, log)
			}
		}
	}()
	return nil
}

// report tells the controlplane a worker pod is gone, retrying while the
// tunnel is down (the call waits for a session) for up to a minute; past
// that the controlplane's lost-agent grace catches the attempt anyway.
func report(ctx context.Context, cp agentv1.ControlplaneClient, g kubeworkers.PodGone, log *slog.Logger) {
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		_, err := cp.WorkerGone(rctx, &agentv1.WorkerGoneRequest{Pod: g.Pod, Pool: g.Pool, MachineId: g.MachineID, Why: g.Why}, grpc.WaitForReady(true))
		if err == nil {
			log.Info("worker pod gone, reported", "pod", g.Pod, "worker_machine_id", g.MachineID, "why", g.Why)
			return
		}
		if rctx.Err() != nil {
			if ctx.Err() == nil {
				log.Warn("could not report a worker pod gone", "pod", g.Pod, "worker_machine_id", g.MachineID, "err", err)
			}
			return
		}
		select {
		case <-rctx.Done():
		case <-time.After(backoff):
		}
	}
}

// Stop closes the tunnel and ends the pod watch, and waits. Safe twice.
func (a *Agent) Stop() {
	if a.stopWatch != nil {
		a.stopWatch()
		<-a.done
	}
	if a.watch != nil {
		a.watch.Stop()
	}
	a.agent.Stop()
}

// Main runs `levers9-agent cluster`.
func Main(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	fs.StringVar(&cfg.StateDir, "state-dir", enroll.ClusterStateDir, "the agent's state directory (from join)")
	fs.StringVar(&cfg.Namespace, "namespace", "", "namespace of the agent and its worker Jobs")
	fs.StringVar(&cfg.Pool, "pool", "", "the pool this cluster serves (the one it joined)")
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster (default: $KUBECONFIG when set, else the pod's service account, in-cluster)")
	cfg.WorkerNodeSelector, cfg.WorkerPodAnnotations = map[string]string{}, map[string]string{}
	fs.Func("worker-node-selector", "KEY=VALUE added to every worker pod's nodeSelector (repeatable)", keyValue(cfg.WorkerNodeSelector))
	fs.Func("worker-pod-annotation", "KEY=VALUE added to every worker pod's annotations (repeatable)", keyValue(cfg.WorkerPodAnnotations))
	fs.StringVar(&cfg.WorkerImage, "worker-image", "", "image of the worker Jobs (default: the controlplane's worker image)")
	fs.StringVar(&cfg.CAFile, "ca-file", "", "controlplane CA the workers join with (default: "+enroll.ClusterJoinDir+"/"+enroll.ClusterCAKey+" when present, else the controlplane's)")
	tunnelAddr := fs.String("tunnel", "", "controlplane tunnel HOST:PORT (default: learnt at join)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.Namespace == "" || cfg.Pool == "" {
		return fmt.Errorf("cluster needs --namespace and --pool: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.CAFile == "" {
		if p := filepath.Join(enroll.ClusterJoinDir, enroll.ClusterCAKey); fileExists(p) {
			cfg.CAFile = p
		}
	}
	if *tunnelAddr != "" {
		cfg.TunnelAddrs = []string{*tunnelAddr}
	}
	rc, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	if cfg.Kube, err = kubernetes.NewForConfig(rc); err != nil {
		return fmt.Errorf("making the Kubernetes client: %w", err)
	}
	cfg.Log = slog.New(slog.NewJSONHandler(stderr, nil))
	a, err := New(cfg)
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		a.Stop()
		return err
	}
	cfg.Log.Info("cluster agent running", "machine_id", a.MachineID(), "pool", cfg.Pool, "namespace", cfg.Namespace)
	<-ctx.Done()
	a.Stop()
	return nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
		}
		return rc, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, fmt.Errorf("not running in a pod (no service account): pass --kubeconfig: %w", err)
		}
		return nil, fmt.Errorf("in-cluster Kubernetes config: %w", err)
	}
	return rc, nil
}

// keyValue parses KEY=VALUE flags into m.
func keyValue(m map[string]string) func(string) error {
	return func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q is not KEY=VALUE", v)
		}
		m[k] = val
		return nil
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
