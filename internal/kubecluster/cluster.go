package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options says where the binaries come from and where the cluster lives.
type Options struct {
	// BinDir holds the binaries and stages.yaml. Empty: run
	// packaging/kube/build.sh, found above the working directory.
	BinDir string
	// BuildProgress receives build.sh's progress (a cold build takes
	// minutes). Nil: discarded.
	BuildProgress io.Writer
	// Dir is the cluster's directory (certificates, kubeconfigs, etcd's
	// data, logs); it must not hold a running cluster. Empty: a temporary
	// directory that Stop removes.
	Dir string
	// Detached components outlive the process that started them (for
	// `make kube-up`); stop them with StopDir. Otherwise they die with it.
	Detached bool
	// Logger gets one line per component started. Nil: discarded.
	Logger *slog.Logger
}

// Cluster is a running control plane. Its methods are safe to call
// concurrently; Stop is idempotent.
type Cluster struct {
	opts    Options
	log     *slog.Logger
	dir     string
	ownDir  bool
	binDir  string
	spawner *spawner

	kubeconfig string
	restConfig *rest.Config
	clientset  *kubernetes.Clientset
	// procs is appended only during Start, before the Cluster is returned.
	procs []*proc

	stopOnce sync.Once
	stopErr  error
}

// Start builds (or finds) the binaries and starts etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and kwok on free loopback ports,
// then creates the nodes kwok-cpu-0 and kwok-gpu-0 and returns once both
// are Ready and the default service account exists. On error everything it
// started is stopped.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	c := &Cluster{opts: opts, log: opts.Logger}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if err := c.prepare(ctx); err != nil {
		return nil, err
	}
	// The start after the build takes seconds; two minutes bounds it.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.run(ctx); err != nil {
		// The directory may go with Stop: keep the end of each log.
		var logs strings.Builder
		for _, p := range c.procs {
			fmt.Fprintf(&logs, "\n--- %s log ends:\n%s", p.name, tail(p.log, 5))
		}
		stopErr := c.Stop()
		return nil, errors.Join(fmt.Errorf("%w%s", err, logs.String()), stopErr)
	}
	return c, nil
}

// prepare finds the binaries and makes the cluster's directory.
func (c *Cluster) prepare(ctx context.Context) error {
	c.binDir = c.opts.BinDir
	if c.binDir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("finding the kube build script: %w", err)
		}
		script, err := FindBuildScript(wd)
		if err != nil {
			return err
		}
		dir, err := Build(ctx, script, c.opts.BuildProgress)
		if err != nil {
			return err
		}
		c.binDir = dir
	} else if err := checkBinDir(c.binDir); err != nil {
		return err
	}

	c.dir = c.opts.Dir
	if c.dir == "" {
		dir, err := os.MkdirTemp("", "kubecluster-")
		if err != nil {
			return fmt.Errorf("making the cluster directory: %w", err)
		}
		c.dir, c.ownDir = dir, true
	} else {
		if pids, err := readPIDs(c.dir); err != nil {
			return err
		} else if len(pids) > 0 {
			return fmt.Errorf("starting a cluster in %s: one is already running there (pids %v)", c.dir, pids)
		}
		// etcd's data of an earlier cluster was signed for another CA and
		// service-account key: start clean.
		for _, sub := range []string{"etcd", "logs", "pki"} {
			if err := os.RemoveAll(filepath.Join(c.dir, sub)); err != nil {
				return fmt.Errorf("clearing %s of an earlier cluster: %w", sub, err)
			}
		}
	}
	for _, sub := range []string{"", "etcd", "logs", "pki"} {
		if err := os.MkdirAll(filepath.Join(c.dir, sub), 0o700); err != nil {
			return fmt.Errorf("making the cluster directory: %w", err)
		}
	}
	if !c.opts.Detached {
		c.spawner = newSpawner()
	}
	return nil
}

func (c *Cluster) run(ctx context.Context) error {
	began := time.Now()
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	server := "https://127.0.0.1:" + strconv.Itoa(ports[2])

	p, err := newPKI(filepath.Join(c.dir, "pki"))
	if err != nil {
		return err
	}
	c.log.Info("certificates made", "after", time.Since(began))
	admin, err := p.clientKubeconfig("admin", "levers9-admin", []string{"system:masters"}, server)
	if err != nil {
		return err
	}
	cmConfig, err := p.clientKubeconfig("controller-manager", "system:kube-controller-manager", nil, server)
	if err != nil {
		return err
	}
	schedConfig, err := p.clientKubeconfig("scheduler", "system:kube-scheduler", nil, server)
	if err != nil {
		return err
	}
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := copyFile(admin, c.kubeconfig); err != nil {
		return err
	}
	if c.restConfig, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig); err != nil {
		return fmt.Errorf("loading the admin kubeconfig: %w", err)
	}
	// Certificates inline, not as files: client-go keeps a reloading
	// transport for file-based ones for the life of the process, which
	// goroutine-leak checks of the packages using a cluster would report.
	if err := rest.LoadTLSFiles(c.restConfig); err != nil {
		return fmt.Errorf("reading the admin kubeconfig's certificates: %w", err)
	}
	c.restConfig.CertFile, c.restConfig.KeyFile = "", ""
	c.restConfig.QPS, c.restConfig.Burst = 100, 200
	if c.clientset, err = kubernetes.NewForConfig(c.restConfig); err != nil {
		return fmt.Errorf("making the admin client: %w", err)
	}

	if err := c.start("etcd", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-url", etcdURL, "--listen-peer-url", peerURL); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "etcd", etcdURL+"/health"); err != nil {
		return err
	}

	if err := c.start("kube-apiserver",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[2]),
		"--tls-cert-file="+p.path("apiserver.crt"),
		"--tls-private-key-file="+p.path("apiserver.key"),
		"--client-ca-file="+p.path("ca.crt"),
		"--service-account-key-file="+p.path("sa.pub"),
		"--service-account-signing-key-file="+p.path("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range="+serviceCIDR,
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--profiling=false",
		"--cert-dir="+filepath.Join(c.dir, "pki"),
	); err != nil {
		return err
	}
	if err := c.waitAPIServer(ctx); err != nil {
		return err
	}
	c.log.Info("apiserver ready", "after", time.Since(began))

	if err := c.start("kube-controller-manager",
		"--kubeconfig="+cmConfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=true",
		// Each controller gets its own service account and token at start;
		// at the default 20 requests/s that alone took ~5 s.
		"--kube-api-qps=200", "--kube-api-burst=400",
		"--service-account-private-key-file="+p.path("sa.key"),
		"--root-ca-file="+p.path("ca.crt"),
		"--cluster-signing-cert-file="+p.path("ca.crt"),
		"--cluster-signing-key-file="+p.path("ca.key"),
		"--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
		"--profiling=false",
	); err != nil {
		return err
	}
	if err := c.start("kube-scheduler",
		"--kubeconfig="+schedConfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--profiling=false",
	); err != nil {
		return err
	}
	if err := c.start("kwok",
		"--kubeconfig="+admin,
		"--config="+filepath.Join(c.binDir, "stages.yaml"),
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector="+KwokAnnotation+"=fake",
		"--cidr=10.244.0.0/16",
		"--node-ip=127.0.0.1",
	); err != nil {
		return err
	}
	if err := c.setUpNodes(ctx); err != nil {
		return err
	}
	c.log.Info("nodes ready", "after", time.Since(began))
	return nil
}

// waitHTTP polls url, served by the component name, until it answers 200
// or a component exits.
func (c *Cluster) waitHTTP(ctx context.Context, name, url string) error {
	return c.poll(ctx, name+" to answer "+url, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// waitAPIServer polls kube-apiserver's /readyz until it answers 200 or a
// component exits.
func (c *Cluster) waitAPIServer(ctx context.Context) error {
	return c.poll(ctx, "kube-apiserver to be ready", func(ctx context.Context) (bool, error) {
		var status int
		c.clientset.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&status)
		return status == http.StatusOK, nil
	})
}

// poll calls check every 50 ms until it returns true, an error, a component
// exits or ctx ends; the errors name what was awaited and carry the log
// tail of a component that died.
func (c *Cluster) poll(ctx context.Context, what string, check func(context.Context) (bool, error)) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, p := range c.procs {
			if p.exited() {
				return fmt.Errorf("waiting for %s: %s exited (%v); its log ends:\n%s", what, p.name, p.err, tail(p.log, 20))
			}
		}
		ok, err := check(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// freePorts picks n distinct free loopback ports. They are free when
// returned; a component binds them a moment later.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("picking a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return fmt.Errorf("copying %s: %w", from, err)
	}
	return writeFile(to, data, 0o600)
}

// Dir is the cluster's directory; logs/NAME.log holds each component's log.
func (c *Cluster) Dir() string { return c.dir }

// KubeconfigPath is the admin kubeconfig (system:masters), mode 0600.
func (c *Cluster) KubeconfigPath() string { return c.kubeconfig }

// RESTConfig is a copy of the admin client configuration.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Clientset is a client acting as the admin.
func (c *Cluster) Clientset() kubernetes.Interface { return c.clientset }

// PIDs maps each component to its process id.
func (c *Cluster) PIDs() map[string]int {
	m := make(map[string]int, len(c.procs))
	for _, p := range c.procs {
		m[p.name] = p.cmd.Process.Pid
	}
	return m
}

// Stop kills every component's process group with SIGKILL, waits until they
// are reaped, and removes the directory when Start made it. Safe to call
// twice. A detached cluster is stopped too; one started by another process
// is stopped with StopDir.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		for _, p := range c.procs {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // its own group
		}
		// One deadline for all: a timer channel fires once, so each wait
		// selects on the shared context instead.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, p := range c.procs {
			select {
			case <-p.done:
			case <-ctx.Done():
				c.stopErr = errors.Join(c.stopErr, fmt.Errorf("stopping %s (pid %d): not gone 10 s after SIGKILL", p.name, p.cmd.Process.Pid))
			}
		}
		if c.spawner != nil {
			c.spawner.close()
		}
		if c.ownDir {
			if err := os.RemoveAll(c.dir); err != nil {
				c.stopErr = errors.Join(c.stopErr, fmt.Errorf("removing the cluster directory: %w", err))
			}
		}
	})
	return c.stopErr
}
