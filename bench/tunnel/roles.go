package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/levers9/levers9/tunnel"
	"github.com/levers9/levers9/tunnel/tunneltest"
)

type x509Cert = x509.Certificate

const startRate = 300

func noProxy(string) (*url.URL, error) { return nil, nil }

// command is what the orchestrator sends a child, one JSON line each.
type command struct {
	Cmd  string `json:"cmd"`
	N    int    `json:"n,omitempty"`
	Rate int    `json:"rate,omitempty"`
	Size int    `json:"size,omitempty"`
	Busy string `json:"busy,omitempty"`
	T0   int64  `json:"t0,omitempty"`
	// Name prefixes the profiles' file names (default "cp").
	Name string `json:"name,omitempty"`
}

// serveCommands answers commands from stdin until it closes.
func serveCommands(handle func(command) any) {
	sc := bufio.NewScanner(os.Stdin)
	enc := json.NewEncoder(os.Stdout)
	for sc.Scan() {
		var c command
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			_ = enc.Encode(map[string]string{"error": err.Error()})
			continue
		}
		_ = enc.Encode(handle(c))
	}
}

func rssKiB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return 0
}

// cpuSeconds is the user plus system CPU time this process used so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func resetKey(dir string) (*[32]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, "reset.key"))
	if err != nil {
		return nil, err
	}
	var k [32]byte
	copy(k[:], b)
	return &k, nil
}

func counterValue(reg *prometheus.Registry, name string, labels map[string]string) float64 {
	mfs, _ := reg.Gather()
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				ok := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						ok = true
					}
				}
				if !ok {
					continue next
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// runCP is the controlplane process: tunnel server, hub, echo service.
func runCP(dir, addr string, pushIdle time.Duration) error {
	ca, err := tunneltest.LoadCA(dir)
	if err != nil {
		return err
	}
	stls, err := ca.ServerTLS()
	if err != nil {
		return err
	}
	key, err := resetKey(dir)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	m, err := tunnel.NewMetrics(reg)
	if err != nil {
		return err
	}
	gs := grpc.NewServer(tunnel.ServerOptions(tunnel.Limits{})...)
	tunneltest.RegisterEcho(gs, nil)
	hub, err := tunnel.NewHub(tunnel.HubConfig{Server: gs, PushIdleTimeout: pushIdle})
	// Agents pushed to before: a first push also makes the agent's push
	// ClientConn and its HTTP/2 connection, and is reported apart.
	pushed := make(map[string]bool)
	if err != nil {
		return err
	}
	srv, err := tunnel.NewServer(tunnel.ServerConfig{
		Addr: addr, TLS: stls, QUICStatelessResetKey: key,
		// Every generated agent dials from 127.0.0.1: one source, as
		// behind a NAT or load balancer, so the per-source cap is raised
		// to the global one (the documented setting for that case).
		MaxHandshakesPerSource: 1024, // tunnel.ServerConfig's default MaxConcurrentHandshakes
		Authorize:              func(_ context.Context, c *x509Cert) (string, error) { return c.Subject.CommonName, nil },
		OnSession:              hub.HandleSession,
		Metrics:                m,
		Logger:                 childLogger(),
	})
	if err != nil {
		return err
	}
	if err := srv.Start(context.Background()); err != nil {
		return err
	}
	defer srv.Stop()
	_ = json.NewEncoder(os.Stdout).Encode(map[string]string{"addr": srv.Addr().String()})
	serveCommands(func(c command) any {
		switch c.Cmd {
		case "stats":
			runtime.GC()
			debug.FreeOSMemory()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return map[string]any{
				"agents": len(hub.Agents()), "rss_kib": rssKiB(), "goroutines": runtime.NumGoroutine(),
				"heap_kib": ms.HeapInuse / 1024, "stack_kib": ms.StackInuse / 1024,
				"failed":  counterValue(reg, "levers9_tunnel_handshakes_total", map[string]string{"result": "failed"}),
				"refused": counterValue(reg, "levers9_tunnel_handshakes_total", map[string]string{"result": "refused"}),
				// Race losers the agents hung up on; not failures.
				"abandoned": counterValue(reg, "levers9_tunnel_handshakes_total", map[string]string{"result": "abandoned"}),
			}
		case "push":
			defer profileCPU(fmt.Sprintf("cp-push-%d.pprof", len(hub.Agents())))()
			return push(hub, pushed, c)
		case "idle":
			// CPU over an idle window.
			cpu := cpuSeconds()
			defer profileCPU("cp-idle.pprof")()
			time.Sleep(time.Duration(c.N) * time.Millisecond)
			return map[string]any{"cpu_s": cpuSeconds() - cpu}
		case "profiles":
			// Goroutine and heap profiles next to the CPU profile, to see
			// what an idle agent costs.
			prefix := cmp.Or(c.Name, "cp")
			for _, name := range []string{"goroutine", "heap"} {
				f, err := os.Create(filepath.Join(dir, prefix+"-"+name+".txt"))
				if err != nil {
					return map[string]string{"error": err.Error()}
				}
				_ = pprof.Lookup(name).WriteTo(f, 1)
				_ = f.Close()
			}
			return map[string]string{}
		}
		return map[string]string{"error": "unknown command " + c.Cmd}
	})
	return nil
}

// profileCPU profiles this process into name under -profile until the
// returned func is called; without -profile, or when profiling cannot
// start, it does nothing.
func profileCPU(name string) (stop func()) {
	if profileDir == "" {
		return func() {}
	}
	stop, err := startCPUProfile(filepath.Join(profileDir, name))
	if err != nil {
		return func() {}
	}
	return stop
}

// startCPUProfile profiles this process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// push sends c.N echo calls of c.Size bytes at c.Rate per second (open
// loop) to random agents, every other one to c.Busy when set.
func push(hub *tunnel.Hub, pushed map[string]bool, c command) any {
	agents := hub.Agents()
	if len(agents) == 0 {
		return map[string]any{"error": "no agents"}
	}
	var busy *tunnel.Agent
	for _, a := range agents {
		if a.Identity == c.Busy {
			busy = a
		}
	}
	payload := make([]byte, c.Size)
	lat := make([]float64, c.N)
	first := make([]bool, c.N)
	var fails atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range c.N {
		at := start.Add(time.Duration(i) * time.Second / time.Duration(c.Rate))
		time.Sleep(time.Until(at))
		a := agents[rand.IntN(len(agents))]
		if busy != nil && i%2 == 0 {
			a = busy
		}
		first[i] = !pushed[a.Identity]
		pushed[a.Identity] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			t := time.Now()
			cc, err := a.Conn()
			if err == nil {
				_, err = tunneltest.Echo(ctx, cc, payload)
			}
			if err != nil {
				fails.Add(1)
				lat[i] = 5000
				return
			}
			lat[i] = float64(time.Since(t).Microseconds()) / 1000
		}()
	}
	wg.Wait()
	var firsts, warm []float64
	for i, v := range lat {
		if first[i] {
			firsts = append(firsts, v)
		} else {
			warm = append(warm, v)
		}
	}
	slices.Sort(lat)
	slices.Sort(firsts)
	slices.Sort(warm)
	return map[string]any{
		"p50": pct(lat, 0.50), "p99": pct(lat, 0.99), "fails": fails.Load(),
		"first_n": len(firsts), "first_p50": pct(firsts, 0.50), "first_p99": pct(firsts, 0.99),
		"warm_p50": pct(warm, 0.50), "warm_p99": pct(warm, 0.99),
	}
}

func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

// runAgents is a load-generator process holding n agents.
func runAgents(dir, addr, prefix string, n int, busy, tcpOnly bool) error {
	ca, err := tunneltest.LoadCA(dir)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	m, err := tunnel.NewMetrics(reg)
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	tunneltest.RegisterEcho(gs, nil)
	log := childLogger()
	upAt := make([]atomic.Int64, n)
	cur := make([]atomic.Pointer[tunnel.Session], n)
	autos := make([]*tunnel.Auto, n)
	for i := range n {
		ctls, err := ca.ClientTLS(fmt.Sprintf("%s-%d", prefix, i))
		if err != nil {
			return err
		}
		autos[i], err = tunnel.NewAuto(tunnel.ClientConfig{
			Addrs: []string{addr}, TLS: ctls, Proxy: noProxy, Metrics: m, Logger: log, DisableQUIC: tcpOnly,
		}, func(ctx context.Context, s tunnel.Session) {
			upAt[i].Store(time.Now().UnixNano())
			cur[i].Store(&s)
			tunnel.ServeGRPC(ctx, s, gs)
		})
		if err != nil {
			return err
		}
	}
	// Agents of a fleet boot over a few seconds, not in the same
	// millisecond: start them at startRate per second.
	for _, a := range autos {
		if err := a.Start(context.Background()); err != nil {
			return err
		}
		time.Sleep(time.Second / startRate)
	}
	defer func() {
		for _, a := range autos {
			a.Stop()
		}
	}()
	if busy {
		// Agent 0 streams "logs" at full speed on its own tunnel.
		cc, err := tunnel.NewClientConn("controlplane", autos[0].OpenStream, tunnel.Limits{})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			chunk := make([]byte, 32<<10)
			for ctx.Err() == nil {
				_, _ = tunneltest.Sink(ctx, cc, chunk)
			}
		}()
		defer cc.Close()
	}
	serveCommands(func(c command) any {
		switch c.Cmd {
		case "status":
			up := 0
			for i := range cur {
				if p := cur[i].Load(); p != nil && (*p).Err() == nil {
					up++
				}
			}
			return map[string]any{"connected": up, "failed": counterValue(reg, "levers9_tunnel_handshakes_total", map[string]string{"result": "failed"})}
		case "since":
			ms := make([]float64, n)
			for i := range upAt {
				if u := upAt[i].Load(); u > c.T0 {
					ms[i] = float64(u-c.T0) / 1e6
				} else {
					ms[i] = -1
				}
			}
			return map[string]any{"ms": ms}
		}
		return map[string]string{"error": "unknown command " + c.Cmd}
	})
	return nil
}

// childLogger logs warnings to stderr, which the orchestrator keeps in a
// file next to the CA; with -profile it logs every handshake too.
func childLogger() *slog.Logger {
	level := slog.LevelWarn
	if profileDir != "" {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}
