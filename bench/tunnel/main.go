// Command tunnel benchmarks the levers9 tunnel: throughput against plain
// TLS, push latency with many idle agents, memory and goroutines per agent,
// a reconnect storm after a controlplane SIGKILL, and control latency under
// packet loss. The controlplane and the load generators run as separate
// processes (this binary re-executed with -role), on separate CPUs unless
// -split-cpus=false. The last line prints the figures issue 3 names; NaN
// marks one that was not measured. Pushes are also reported split into
// first pushes to an agent (which make its push ClientConn) and the rest.
// The cost per idle agent is per transport (QUIC on the main fleet, TLS +
// yamux on a controlplane of its own) and for agents nobody pushed to within
// the push idle timeout; kib_per_agent_pushed is the cost just after the
// pushes, with their push ClientConns still open.
// -only runs some phases; -profile keeps CPU, heap and goroutine profiles
// and the children's logs in a directory.
package main

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/levers9/levers9/internal/procstat"
	"github.com/levers9/levers9/tunnel/tunneltest"
)

func main() {
	quick := flag.Bool("quick", false, "smaller run, at most ~2 minutes")
	role := flag.String("role", "", "internal: cp or agents")
	dir := flag.String("dir", "", "internal: CA directory")
	addr := flag.String("addr", "127.0.0.1:0", "internal: tunnel address")
	n := flag.Int("n", 0, "internal: agents in this process")
	prefix := flag.String("prefix", "agent", "internal: agent name prefix")
	busy := flag.Bool("busy", false, "internal: agent 0 streams logs at full speed")
	tcpOnly := flag.Bool("tcp", false, "internal: agents dial TCP (TLS + yamux) only")
	pushIdle := flag.Duration("push-idle", 0, "internal: the controlplane's push idle timeout (0: the product's default)")
	flag.IntVar(&fleet1, "fleet1k", 1000, "agents for the *_1k figures (scale down on a small machine)")
	flag.IntVar(&fleet5, "fleet5k", 5000, "agents for the *_5k and storm figures")
	only := flag.String("only", "throughput,fleet,loss", "phases to run: throughput, fleet (push, idle cost, reconnect storm), loss")
	flag.BoolVar(&splitCPUs, "split-cpus", runtime.NumCPU() >= 2, "run the controlplane on the first half of the CPUs and the load generators on the rest (taskset), so the controlplane's figures are its own")
	flag.StringVar(&profileDir, "profile", "", "keep in this directory: every process's CPU profile, the controlplane's heap and goroutine profiles, and the children's logs (at Info)")
	cpuprofile := flag.String("cpuprofile", "", "internal: write this child's CPU profile here")
	flag.Parse()
	stopProfile := func() {}
	if *cpuprofile != "" {
		stop, err := startCPUProfile(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/tunnel:", err)
			os.Exit(1)
		}
		stopProfile = stop
	}
	defer stopProfile()
	var err error
	switch *role {
	case "cp":
		err = runCP(*dir, *addr, *pushIdle)
	case "agents":
		err = runAgents(*dir, *addr, *prefix, *n, *busy, *tcpOnly)
	case "":
		var run map[string]bool
		if run, err = phases(*only); err == nil {
			err = orchestrate(*quick, run)
		}
	default:
		err = fmt.Errorf("unknown role %q", *role)
	}
	if err != nil {
		stopProfile()
		fmt.Fprintln(os.Stderr, "bench/tunnel:", err)
		os.Exit(1)
	}
}

var (
	fleet1, fleet5 int
	profileDir     string
	splitCPUs      bool
)

// cpuRange is the CPUs a child of role runs on, lo to hi: the first half
// for the controlplane, the rest for the load generators.
func cpuRange(role string) (lo, hi int) {
	n := runtime.NumCPU()
	if role == "cp" {
		return 0, n/2 - 1
	}
	return n / 2, n - 1
}

// cpuList is cpuRange as a taskset list.
func cpuList(role string) string {
	lo, hi := cpuRange(role)
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d-%d", lo, hi)
}

func phases(list string) (map[string]bool, error) {
	m := map[string]bool{}
	for _, p := range strings.Split(list, ",") {
		switch p = strings.TrimSpace(p); p {
		case "throughput", "fleet", "loss":
			m[p] = true
		default:
			return nil, fmt.Errorf("-only: unknown phase %q (want throughput, fleet or loss)", p)
		}
	}
	return m, nil
}

type child struct {
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
}

func spawn(dir, name string, args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if profileDir != "" {
		args = append(args, "-profile", profileDir)
		if name != "cp" { // the first controlplane profiles its idle window only
			args = append(args, "-cpuprofile", filepath.Join(profileDir, name+".pprof"))
		}
	}
	argv := append([]string{exe, "-dir", dir}, args...)
	if splitCPUs {
		// Pinned before exec, so every thread the child makes inherits
		// the set and its GOMAXPROCS matches it.
		role := "agents"
		if slices.Contains(args, "cp") {
			role = "cp"
		}
		argv = append([]string{"taskset", "-c", cpuList(role)}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	return &child{name: name, cmd: cmd, in: in, out: sc}, nil
}

func (c *child) read(v any) error {
	if !c.out.Scan() {
		return fmt.Errorf("%s: no answer (exited? see its log): %v", c.name, c.out.Err())
	}
	return json.Unmarshal(c.out.Bytes(), v)
}

func (c *child) call(cmd command, v any) error {
	b, _ := json.Marshal(cmd)
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("%s: %w", c.name, err)
	}
	return c.read(v)
}

func (c *child) stop() {
	_ = c.in.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.cmd.Wait()
}

type cpStats struct {
	Agents     int     `json:"agents"`
	RSSKiB     int64   `json:"rss_kib"`
	HeapKiB    int64   `json:"heap_kib"`
	StackKiB   int64   `json:"stack_kib"`
	Goroutines int     `json:"goroutines"`
	Failed     float64 `json:"failed"`
	Refused    float64 `json:"refused"`
	Abandoned  float64 `json:"abandoned"`
}

type pushResult struct {
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
	Fails int64   `json:"fails"`
	Error string  `json:"error"`
	// First pushes to an agent also connect its push ClientConn.
	FirstN   int     `json:"first_n"`
	FirstP50 float64 `json:"first_p50"`
	FirstP99 float64 `json:"first_p99"`
	WarmP50  float64 `json:"warm_p50"`
	WarmP99  float64 `json:"warm_p99"`
}

func (r pushResult) String() string {
	return fmt.Sprintf("p50 %.2f ms p99 %.2f ms fails %d (%d first pushes: p50 %.2f p99 %.2f ms; the rest: p50 %.2f p99 %.2f ms)",
		r.P50, r.P99, r.Fails, r.FirstN, r.FirstP50, r.FirstP99, r.WarmP50, r.WarmP99)
}

// waitConnected waits until want agents are connected or d passed; it
// returns how many are connected and says so when short.
func waitConnected(cp *child, want int, d time.Duration) (int, error) {
	start := time.Now()
	for {
		var st cpStats
		if err := cp.call(command{Cmd: "stats"}, &st); err != nil {
			return 0, err
		}
		if st.Agents >= want {
			fmt.Printf("%d agents connected in %s\n", st.Agents, time.Since(start).Round(100*time.Millisecond))
			return st.Agents, nil
		}
		if time.Since(start) > d {
			fmt.Printf("only %d of %d agents connected after %s (this machine is shared; figures below are for what connected)\n", st.Agents, want, d)
			return st.Agents, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func orchestrate(quick bool, run map[string]bool) error {
	nan := math.NaN()
	fig := map[string]float64{}
	names := []string{"yamux_vs_tls", "quic_vs_tls", "push_p99_ms_1k", "push_p99_ms_5k", "push_p99_ms_busy",
		"kib_per_agent", "goroutines_per_agent", "kib_per_agent_quic", "goroutines_per_agent_quic",
		"kib_per_agent_yamux", "goroutines_per_agent_yamux", "kib_per_agent_pushed", "reconnect_s_p99", "reconnect_s_all", "handshake_failures",
		"ctrl_p99_ms_loss1_quic", "ctrl_p99_ms_loss1_yamux"}
	for _, n := range names {
		fig[n] = nan
	}
	defer func() {
		var b strings.Builder
		for i, n := range names {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s=%.3g", n, fig[n])
		}
		fmt.Println(b.String())
	}()
	begin := time.Now()

	if run["throughput"] {
		measureThroughputFigures(quick, fig)
	}
	if run["fleet"] {
		if err := measureFleet(quick, fig); err != nil {
			return err
		}
	}
	if run["loss"] {
		if l, err := measureLoss(quick); err != nil {
			fmt.Println("loss:", err)
		} else {
			fig["ctrl_p99_ms_loss1_quic"] = l.quic
			fig["ctrl_p99_ms_loss1_yamux"] = l.yamux
		}
	}
	fmt.Printf("bench took %s\n", time.Since(begin).Round(time.Second))
	return nil
}

func measureThroughputFigures(quick bool, fig map[string]float64) {
	t, err := measureThroughput(quick)
	if err != nil {
		fmt.Println("throughput:", err)
	} else {
		fmt.Printf("throughput: tls x1 %.0f MB/s, x8 %.0f MB/s; ratios yamux x1 %.2f x8 %.2f, quic x1 %.2f x8 %.2f\n", t.tls1, t.tls8, t.yamux1, t.yamux8, t.quic1, t.quic8)
		// One figure per transport: the geometric mean of 1 and 8 streams.
		fig["yamux_vs_tls"] = math.Sqrt(t.yamux1 * t.yamux8)
		fig["quic_vs_tls"] = math.Sqrt(t.quic1 * t.quic8)
	}
}

// measureFleet connects fleets of idle agents to one controlplane process:
// push latency, cost per idle agent, then the reconnect storm.
func measureFleet(quick bool, fig map[string]float64) error {
	if splitCPUs {
		fmt.Printf("controlplane on CPUs %s, load generators on CPUs %s (-split-cpus=false shares them)\n", cpuList("cp"), cpuList("agents"))
	}
	dir, cleanup, err := fleetDir()
	if err != nil {
		return err
	}
	defer cleanup()
	f := &fleet{dir: dir, quick: quick, fig: fig}
	defer f.stop()
	if err := f.measureYamuxIdleCost(); err != nil {
		return err
	}
	if err := f.startControlplane(); err != nil {
		return err
	}
	var base cpStats
	if err := f.cp.call(command{Cmd: "stats"}, &base); err != nil {
		return err
	}
	total, err := f.measurePushes()
	if err != nil {
		return err
	}
	if err := f.measureIdleCost(base); err != nil {
		return err
	}
	return f.measureReconnectStorm(total)
}

// fleetDir is where the fleet's CA, reset key and (with -profile) profiles
// go; cleanup removes a temporary one.
func fleetDir() (dir string, cleanup func(), err error) {
	cleanup = func() {}
	dir = profileDir
	if dir == "" {
		d, err := os.MkdirTemp("", "l9t-bench-")
		if err != nil {
			return "", nil, err
		}
		dir, cleanup = d, func() { os.RemoveAll(d) }
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	ca, err := tunneltest.NewCA("bench")
	if err == nil {
		err = ca.WritePEM(dir)
	}
	if err == nil {
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		err = os.WriteFile(filepath.Join(dir, "reset.key"), key, 0o600)
	}
	if err != nil {
		cleanup()
		return "", nil, err
	}
	return dir, cleanup, nil
}

// fleet is one controlplane process and the agent processes connected to
// it.
type fleet struct {
	dir      string
	quick    bool
	fig      map[string]float64
	addr     string
	cp       *child
	children []*child
}

// stop ends the agents and the current controlplane.
func (f *fleet) stop() {
	for _, c := range f.children {
		c.stop()
	}
	if f.cp != nil {
		f.cp.stop()
	}
}

// benchPushIdle is the fleet controlplane's push idle timeout: an agent's
// push ClientConn is closed after that long without a push. The product
// waits 2 minutes; the bench waits 3 s so that the cost of agents nobody
// pushed to lately is measured within a quick run.
const benchPushIdle = 3 * time.Second

// spawnControlplane starts a controlplane child named name and learns its
// address.
func spawnControlplane(dir, name string, args ...string) (*child, string, error) {
	cp, err := spawn(dir, name, append([]string{"-role", "cp", "-push-idle", benchPushIdle.String()}, args...)...)
	if err != nil {
		return nil, "", err
	}
	var hello struct{ Addr string }
	if err := cp.read(&hello); err != nil {
		cp.kill()
		return nil, "", err
	}
	return cp, hello.Addr, nil
}

// startControlplane spawns the fleet's controlplane.
func (f *fleet) startControlplane() error {
	cp, addr, err := spawnControlplane(f.dir, "cp")
	if err != nil {
		return err
	}
	f.cp, f.addr = cp, addr
	return nil
}

// measureYamuxIdleCost measures what an idle TLS + yamux agent costs, on a
// controlplane of its own (the QUIC figures come from the main fleet).
func (f *fleet) measureYamuxIdleCost() error {
	cp, addr, err := spawnControlplane(f.dir, "cp-yamux")
	if err != nil {
		return err
	}
	defer cp.stop()
	var base cpStats
	if err := cp.call(command{Cmd: "stats"}, &base); err != nil {
		return err
	}
	agents, err := spawn(f.dir, "agents-yamux", "-role", "agents", "-addr", addr, "-n", fmt.Sprint(fleet1), "-prefix", "y", "-tcp")
	if err != nil {
		return err
	}
	defer agents.stop()
	if _, err := waitConnected(cp, fleet1, 60*time.Second); err != nil {
		return err
	}
	var st cpStats
	if err := cp.call(command{Cmd: "stats"}, &st); err != nil {
		return err
	}
	if st.Agents == 0 {
		return fmt.Errorf("no TLS + yamux agent connected")
	}
	if profileDir != "" {
		var ignored map[string]string
		if err := cp.call(command{Cmd: "profiles", Name: "cp-yamux"}, &ignored); err != nil {
			return err
		}
	}
	f.fig["kib_per_agent_yamux"] = float64(st.RSSKiB-base.RSSKiB) / float64(st.Agents)
	f.fig["goroutines_per_agent_yamux"] = float64(st.Goroutines-base.Goroutines) / float64(st.Agents)
	fmt.Printf("idle TLS + yamux: %d agents cost %.1f KiB and %.2f goroutines each\n", st.Agents, f.fig["kib_per_agent_yamux"], f.fig["goroutines_per_agent_yamux"])
	printBreakdown("TLS + yamux", base, st)
	return nil
}

// measurePushes measures push latency to 1,000 idle agents, with one busy
// agent, and to 5,000, then (unless quick) grows the fleet to 10,000. It
// returns the fleet's size.
func (f *fleet) measurePushes() (int, error) {
	quick, dir, addr, cp, fig := f.quick, f.dir, f.addr, f.cp, f.fig
	pushes, rate, size := 10000, 1000, 4096
	wait1k, wait5k := 60*time.Second, 120*time.Second
	if quick {
		pushes, rate = 1500, 500
		wait1k, wait5k = 15*time.Second, 30*time.Second
	}
	// 1,000 idle agents.
	a1, err := spawn(dir, "agents1", "-role", "agents", "-addr", addr, "-n", fmt.Sprint(fleet1), "-prefix", "a")
	if err != nil {
		return 0, err
	}
	f.children = append(f.children, a1)
	if _, err := waitConnected(cp, fleet1, wait1k); err != nil {
		return 0, err
	}
	var pr pushResult
	if err := cp.call(command{Cmd: "push", N: pushes, Rate: rate, Size: size}, &pr); err != nil {
		return 0, err
	}
	fmt.Printf("push %d agents: %s\n", fleet1, pr)
	fig["push_p99_ms_1k"] = pr.P99

	// One agent streaming logs at full speed; half the pushes go to it.
	b1, err := spawn(dir, "busy", "-role", "agents", "-addr", addr, "-n", "1", "-prefix", "busy", "-busy")
	if err != nil {
		return 0, err
	}
	if _, err := waitConnected(cp, fleet1+1, 20*time.Second); err != nil {
		return 0, err
	}
	time.Sleep(time.Second) // let the log stream reach full speed
	if err := cp.call(command{Cmd: "push", N: pushes, Rate: rate, Size: size, Busy: "busy-0"}, &pr); err != nil {
		return 0, err
	}
	fmt.Printf("push with a busy agent: %s\n", pr)
	fig["push_p99_ms_busy"] = pr.P99
	b1.stop()

	// 5,000 idle agents.
	a2, err := spawn(dir, "agents2", "-role", "agents", "-addr", addr, "-n", fmt.Sprint(fleet5-fleet1), "-prefix", "b")
	if err != nil {
		return 0, err
	}
	f.children = append(f.children, a2)
	got, err := waitConnected(cp, fleet5, wait5k)
	if err != nil {
		return 0, err
	}
	if err := cp.call(command{Cmd: "push", N: pushes, Rate: rate, Size: size}, &pr); err != nil {
		return 0, err
	}
	fmt.Printf("push %d agents: %s\n", got, pr)
	if got >= fleet5*9/10 {
		fig["push_p99_ms_5k"] = pr.P99
	}
	total := fleet5
	if !quick {
		a3, err := spawn(dir, "agents3", "-role", "agents", "-addr", addr, "-n", fmt.Sprint(fleet5), "-prefix", "c")
		if err != nil {
			return 0, err
		}
		f.children = append(f.children, a3)
		if _, err := waitConnected(cp, 2*fleet5, 120*time.Second); err != nil {
			return 0, err
		}
		total = 2 * fleet5
	}
	return total, nil
}

// printBreakdown splits an idle agent's RSS into the Go heap in use, the
// goroutine stacks and the rest (the runtime's own structures, freed pages
// not yet returned), to show where a kib_per_agent figure comes from.
func printBreakdown(transport string, base, st cpStats) {
	n := float64(st.Agents)
	heap := float64(st.HeapKiB-base.HeapKiB) / n
	stack := float64(st.StackKiB-base.StackKiB) / n
	rss := float64(st.RSSKiB-base.RSSKiB) / n
	fmt.Printf("idle %s agent: %.1f KiB = heap %.1f + stacks %.1f + other %.1f\n", transport, rss, heap, stack, rss-heap-stack)
}

// measureIdleCost measures what holding the idle fleet costs the
// controlplane: CPU over a quiet interval, and memory and goroutines per
// agent against base.
func (f *fleet) measureIdleCost(base cpStats) error {
	cp, fig := f.cp, f.fig
	// Right after the pushes, the agents pushed to still hold a push
	// ClientConn; the idle window below outlasts benchPushIdle, so the
	// figures after it are for agents nobody pushed to lately.
	var pushed cpStats
	if err := cp.call(command{Cmd: "stats"}, &pushed); err != nil {
		return err
	}
	fig["kib_per_agent_pushed"] = float64(pushed.RSSKiB-base.RSSKiB) / float64(pushed.Agents)
	fmt.Printf("controlplane with %d agents just after the pushes: rss %d KiB, %d goroutines\n", pushed.Agents, pushed.RSSKiB, pushed.Goroutines)
	idle := max(5*time.Second, benchPushIdle*3/2)
	var used struct {
		CPU float64 `json:"cpu_s"`
	}
	if err := cp.call(command{Cmd: "idle", N: int(idle.Milliseconds())}, &used); err != nil {
		return err
	}
	var st cpStats
	if err := cp.call(command{Cmd: "stats"}, &st); err != nil {
		return err
	}
	fmt.Printf("controlplane CPU with %d idle agents: %.0f%% of a core\n", st.Agents, 100*used.CPU/idle.Seconds())
	if profileDir != "" {
		var ignored map[string]string
		if err := cp.call(command{Cmd: "profiles"}, &ignored); err != nil {
			return err
		}
	}
	// QUIC is the default transport: kib_per_agent is its figure.
	fig["kib_per_agent"] = float64(st.RSSKiB-base.RSSKiB) / float64(st.Agents)
	fig["goroutines_per_agent"] = float64(st.Goroutines-base.Goroutines) / float64(st.Agents)
	fig["kib_per_agent_quic"], fig["goroutines_per_agent_quic"] = fig["kib_per_agent"], fig["goroutines_per_agent"]
	fmt.Printf("controlplane with %d idle agents: rss %d KiB, %d goroutines (baseline %d KiB, %d)\n", st.Agents, st.RSSKiB, st.Goroutines, base.RSSKiB, base.Goroutines)
	printBreakdown("QUIC", base, st)

	return nil
}

// measureReconnectStorm SIGKILLs the controlplane, starts a new one on the
// same address at once, and measures how long the agents take to return.
func (f *fleet) measureReconnectStorm(total int) error {
	quick, fig := f.quick, f.fig
	genBefore := f.generatorsCPU()
	f.cp.kill()
	t0 := time.Now()
	cp, _, err := spawnControlplane(f.dir, "cp2", "-addr", f.addr)
	if err != nil {
		return err
	}
	f.cp = cp
	limit := 60 * time.Second
	if quick {
		limit = 20 * time.Second
	}
	var back []float64
	for {
		back = back[:0]
		for _, c := range f.children {
			var r struct{ Ms []float64 }
			if err := c.call(command{Cmd: "since", T0: t0.UnixNano()}, &r); err != nil {
				return err
			}
			back = append(back, r.Ms...)
		}
		if !slices.Contains(back, -1) || time.Since(t0) > limit {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	missing := 0
	for i, v := range back {
		if v < 0 {
			missing++
			back[i] = math.Inf(1)
		}
	}
	slices.Sort(back)
	// Agents still missing at the limit leave the figure unmeasured (NaN).
	if v := pct(back, 0.99) / 1000; !math.IsInf(v, 1) {
		fig["reconnect_s_p99"] = v
	}
	if v := back[len(back)-1] / 1000; !math.IsInf(v, 1) {
		fig["reconnect_s_all"] = v
	}
	var st cpStats
	if err := cp.call(command{Cmd: "stats"}, &st); err != nil {
		return err
	}
	fig["handshake_failures"] = st.Failed
	fmt.Printf("reconnect storm (%d agents): p99 %.2f s, all %.2f s, %d missing, %v refused (handshake cap or retry-after), %v failed handshakes, %v abandoned (race losers)\n", total, fig["reconnect_s_p99"], fig["reconnect_s_all"], missing, st.Refused, st.Failed, st.Abandoned)
	// Each agent's handshake costs its side about what it costs the
	// controlplane: a storm figure is the controlplane's own only while the
	// load generators had CPU to spare.
	wall := time.Since(t0).Seconds()
	cpCPU, _ := processCPU(cp.cmd.Process.Pid)
	gen := f.generatorsCPU() - genBefore
	fmt.Printf("CPU during the storm (%.1f s): controlplane %.0f%% of its %d CPUs, load generators %.0f%% of their %d\n",
		wall, 100*cpCPU/wall/float64(cpuCount("cp")), cpuCount("cp"), 100*gen/wall/float64(cpuCount("agents")), cpuCount("agents"))
	return nil
}

// generatorsCPU is the CPU seconds the agents' processes used so far.
func (f *fleet) generatorsCPU() float64 {
	var sum float64
	for _, c := range f.children {
		if s, err := processCPU(c.cmd.Process.Pid); err == nil {
			sum += s
		}
	}
	return sum
}

// processCPU is the CPU seconds process pid used so far (its threads
// included).
func processCPU(pid int) (float64, error) {
	st, err := procstat.Read(pid)
	return st.CPU().Seconds(), err
}

// cpuCount is how many CPUs a child of role runs on.
func cpuCount(role string) int {
	if !splitCPUs {
		return runtime.NumCPU()
	}
	lo, hi := cpuRange(role)
	return hi - lo + 1
}
