// Command tasks benchmarks levers9's task path end to end on this machine:
// submit-to-first-output-line of a trivial task through the controlplane
// (queue, scheduler, tunnel push), an agent (cached image, sandbox, runc)
// and the report path back to a follower, against a bare `runc run` of an
// equivalent bundle and a `podman run` of the same image measured in the
// same run (the bare runc bundle is the agent's own hardened spec), plus the
// throughput of trivial tasks with two agents.
//
// The stack is real and private (internal/benchstack): Postgres, Redis and
// a docker-registry on free loopback ports under a temporary directory, the
// controlplane and two agents in this process. Containers run without the egress network on all
// three sides (podman --network none): two agents in one network namespace
// would share a bridge subnet, and the host's own FORWARD chain is not the
// benchmark's to change. Its last line is
//
//	overhead_ms_p50=… overhead_ms_p99=… vs_podman=… tasks_per_s=…
//
// Above it, the per-phase breakdown of levers9's first line (submit to
// stored, to scheduled, to running, to the first line at the follower),
// and scheduled→running split by the agent's own start phases
// (worker_task_start_phase_seconds: image, network, prepare, create,
// start, ...) and what lies outside them.
// overhead_ms_* is levers9's first-line latency minus bare runc's at that
// percentile; vs_podman the ratio of medians (levers9 / podman). Needs root.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/levers9/levers9/internal/benchstack"
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

func run(rounds, burst int) error {
	ctx := context.Background()
	s, err := benchstack.Start(ctx, benchstack.Options{Name: "l9t", Pools: []string{"default", "default"}})
	if err != nil {
		return err
	}
	defer s.Close()
	runcFirst, err := bareRunc(ctx, s)
	if err != nil {
		return err
	}
	podmanFirst, err := podman(s)
	if err != nil {
		return err
	}
	// Warm every agent's image cache and the paths.
	for i := 0; i < 4; i++ {
		if _, err := firstLine(s); err != nil {
			return fmt.Errorf("warm-up task: %w", err)
		}
	}
	var l9, bare, pod []time.Duration
	var phases [4][]time.Duration
	agentPhases := map[string][]time.Duration{}
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
				var tr benchstack.Trace
				tr, err = s.FirstLineTrace("")
				d = tr.First
				l9 = append(l9, d)
				for i, p := range tr.Phases {
					phases[i] = append(phases[i], p)
				}
				// The image, volumes and network phases run side by
				// side: the longest of them is the agent's time.
				var inAgent, beside time.Duration
				for name, d := range tr.Agent {
					agentPhases[name] = append(agentPhases[name], d)
					switch name {
					case "image", "volumes", "network":
						beside = max(beside, d)
					default:
						inAgent += d
					}
				}
				inAgent += beside
				agentPhases["outside"] = append(agentPhases["outside"], tr.Phases[2]-inAgent)
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
	perSec, err := throughput(s, burst)
	if err != nil {
		return err
	}
	for _, x := range []struct {
		name string
		d    []time.Duration
	}{{"levers9", l9}, {"bare runc", bare}, {"podman", pod}} {
		fmt.Printf("%-10s first line p50 %v p99 %v over %d runs\n", x.name, pct(x.d, 50), pct(x.d, 99), len(x.d))
	}
	// Where levers9's first line goes, from the instants the controlplane
	// records (each phase's own percentiles: they need not add up).
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	fmt.Print("phases p50/p99 ms:")
	for i, name := range benchstack.PhaseNames {
		fmt.Printf(" %s %.1f/%.1f", name, ms(pct(phases[i], 50)), ms(pct(phases[i], 99)))
	}
	fmt.Println()
	// scheduled→running as the agent saw it; "outside" is the rest of it
	// (the push down the tunnel, taking the attempt).
	fmt.Print("scheduled→running p50/p99 ms:")
	for _, name := range append(benchstack.AgentPhaseNames, "outside") {
		if d := agentPhases[name]; len(d) > 0 {
			fmt.Printf(" %s %.1f/%.1f", name, ms(pct(d, 50)), ms(pct(d, 99)))
		}
	}
	fmt.Println()
	fmt.Printf("throughput: %d trivial tasks on 2 agents at %.1f tasks/s\n", burst, perSec)
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

// firstLine is the first-line latency of `echo hi` on the stack's image.
func firstLine(s *benchstack.Stack) (time.Duration, error) {
	first, _, err := s.FirstLine("")
	return first, err
}

// throughput runs n trivial tasks at once and returns tasks per second
// from the first submit to the last end.
func throughput(s *benchstack.Stack, n int) (float64, error) {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := firstLine(s); err != nil {
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

// bareRunc returns a runner timing `runc run` of the stack's bare bundle
// (busybox rootfs, the default pool's hardened spec with its seccomp
// profile: the very bundle the agent's sandbox would run for the same
// command) to its first output line: the difference is levers9's own
// cost, not hardening's.
func bareRunc(ctx context.Context, s *benchstack.Stack) (func(int) (time.Duration, error), error) {
	bundle, err := s.BareBundle(ctx)
	if err != nil {
		return nil, err
	}
	return func(i int) (time.Duration, error) {
		cmd, err := bundle.Command(i, "/bin/echo", "hi")
		if err != nil {
			return 0, err
		}
		return timeFirstLine(cmd)
	}, nil
}

// podman pulls the image once and returns a runner timing `podman run` of
// it to its first output line.
func podman(s *benchstack.Stack) (func(int) (time.Duration, error), error) {
	dir := filepath.Join(s.Work, "podman")
	pm := func(args ...string) *exec.Cmd {
		return exec.Command("podman", append([]string{"--root", dir + "/root", "--runroot", dir + "/runroot",
			"--cgroup-manager=cgroupfs", "--events-backend=file"}, args...)...)
	}
	if out, err := pm("pull", "--tls-verify=false", s.Image).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("podman pull: %w: %s", err, out)
	}
	s.OnClose(func() { _ = pm("rm", "-a", "-f").Run() })
	return func(i int) (time.Duration, error) {
		d, err := timeFirstLine(pm("run", "--name", fmt.Sprintf("l9tb-pod-%d", i), "--network", "none",
			"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", s.Image, "echo", "hi"))
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
