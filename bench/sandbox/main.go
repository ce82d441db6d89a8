// Command sandbox benchmarks container start-to-exit of a trivial command
// (/bin/true in a busybox rootfs) through the sandbox package with runc and
// runsc, against a bare `runc run` of the same bundle and a `podman run
// --rootfs` of the same rootfs, in one run. Each ratio is the median over
// rounds of a pair run back to back; its last line is
//
//	runc_vs_bare=… runsc_vs_bare=… runc_vs_podman=…
//
// Everything it creates carries the l9s-bench prefix and is removed at the
// end (podman's storage, runtime state and cgroups included). Needs root.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	"github.com/levers9/levers9/agent"
	"github.com/levers9/levers9/sandbox"
)

const (
	stateDir   = "/run/l9s-bench"
	podmanDir  = "/run/l9s-bench-podman"
	cgroupBase = "/l9s-bench"
)

func main() {
	quick := flag.Bool("quick", false, "8 rounds instead of 20 (about a minute)")
	n := flag.Int("n", 20, "paired rounds")
	runsc := flag.String("runsc", agent.DefaultRunscPath(), "the runsc binary (default: the agent's, the pinned build when installed)")
	flag.Parse()
	if *quick {
		*n = 8
	}
	if err := run(*n, *runsc); err != nil {
		log.Fatal(err)
	}
}

func run(n int, runsc string) error {
	ctx := context.Background()
	work, err := os.MkdirTemp("", "l9s-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	rootfs := filepath.Join(work, "rootfs")
	if err := makeRootfs(rootfs); err != nil {
		return err
	}
	host, err := sandbox.DetectHost(ctx, sandbox.NVIDIADiscovery{})
	if err != nil {
		return err
	}
	sb, err := sandbox.New(sandbox.Config{StateDir: stateDir, CgroupParent: cgroupBase, Host: host, RunscPath: runsc})
	if err != nil {
		return err
	}
	defer os.RemoveAll(podmanDir)
	defer os.RemoveAll(stateDir)
	defer func() {
		_ = sb.Reconcile(context.Background())
		removeCgroups()
	}()
	if err := sb.Reconcile(ctx); err != nil {
		return err
	}
	sec := sandbox.Security{Profile: sandbox.ProfileHardened, Seccomp: sandbox.SeccompEnforce, DropNetRaw: true}

	bareBundle, err := writeBareBundle(work, rootfs, sec, host)
	if err != nil {
		return err
	}

	podman := func(i int) error {
		name := fmt.Sprintf("l9s-bench-pod-%d", i)
		cmd := podmanCmd("run", "--name", name, "--network", "none",
			"--cgroup-parent", cgroupBase+"/podman", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
			"--rootfs", rootfs, "/bin/true")
		return cmd.Run()
	}
	variants := map[string]func(i int) error{
		"sandbox_runc":  func(i int) error { return viaSandbox(ctx, sb, rootfs, sec, sandbox.RuntimeRunc, i) },
		"sandbox_runsc": func(i int) error { return viaSandbox(ctx, sb, rootfs, sec, sandbox.RuntimeRunsc, i) },
		"bare_runc": func(i int) error {
			return exec.Command("runc", "--root", stateDir+"/bare-root", "run", "--bundle", bareBundle, fmt.Sprintf("l9s-bench-bare-%d", i)).Run()
		},
		"podman": podman,
	}
	// Each ratio comes from pairs run back to back, in alternating order,
	// so load from other processes hits both sides alike. podman runs
	// without --rm and is removed outside the timing: --rm finishes its
	// cleanup asynchronously and would slow whatever runs next.
	pairs := [][2]string{{"sandbox_runc", "bare_runc"}, {"sandbox_runsc", "bare_runc"}, {"sandbox_runc", "podman"}}
	ratios, times, err := measurePairs(n, variants, pairs)
	if err != nil {
		return err
	}
	for _, name := range []string{"sandbox_runc", "bare_runc", "sandbox_runsc", "podman"} {
		fmt.Printf("%-14s median %v over %d runs\n", name, median(times[name]), len(times[name]))
	}
	med := func(r []float64) float64 {
		s := append([]float64(nil), r...)
		sort.Float64s(s)
		return s[len(s)/2]
	}
	fmt.Printf("runc_vs_bare=%.3f runsc_vs_bare=%.3f runc_vs_podman=%.3f\n", med(ratios[0]), med(ratios[1]), med(ratios[2]))
	return nil
}

// measurePairs runs each pair back to back n times (after one warm-up
// round), alternating which goes first, and returns each pair's time
// ratios and every variant's times.
func measurePairs(n int, variants map[string]func(i int) error, pairs [][2]string) ([][]float64, map[string][]time.Duration, error) {
	ratios := make([][]float64, len(pairs))
	times := map[string][]time.Duration{}
	seq := 0
	for round := -1; round < n; round++ {
		for p, pair := range pairs {
			order := []string{pair[0], pair[1]}
			if round%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			took := map[string]time.Duration{}
			for _, name := range order {
				seq++
				start := time.Now()
				if err := variants[name](seq); err != nil {
					return nil, nil, fmt.Errorf("%s round %d: %w", name, round, err)
				}
				took[name] = time.Since(start)
				if name == "podman" {
					if out, err := podmanCmd("rm", "-f", fmt.Sprintf("l9s-bench-pod-%d", seq)).CombinedOutput(); err != nil {
						return nil, nil, fmt.Errorf("podman rm: %w: %s", err, out)
					}
				}
			}
			if round < 0 {
				continue // warm-up
			}
			ratios[p] = append(ratios[p], float64(took[pair[0]])/float64(took[pair[1]]))
			for name, d := range took {
				times[name] = append(times[name], d)
			}
		}
	}
	return ratios, times, nil
}

// writeBareBundle writes an OCI bundle with the very spec the sandbox would
// run, for runc to run bare.
func writeBareBundle(work, rootfs string, sec sandbox.Security, host sandbox.Host) (string, error) {
	task := sandbox.TaskSpec{ID: "bare", Rootfs: rootfs, Args: []string{"/bin/true"}}
	spec, _, err := sandbox.BuildSpec(task, sec.WithDefaults(), host)
	if err != nil {
		return "", err
	}
	spec.Linux.CgroupsPath = cgroupBase + "/l9s-bench-bare"
	bareBundle := filepath.Join(work, "bare")
	if err := os.MkdirAll(bareBundle, 0o700); err != nil {
		return "", err
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bareBundle, "config.json"), b, 0o600); err != nil {
		return "", err
	}
	return bareBundle, nil
}

// removeCgroups removes podman's (conmon included) and the bare run's
// cgroups under our parent, deepest first; rmdir refuses any still in use.
func removeCgroups() {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*" + cgroupBase)
	for _, r := range append(roots, "/sys/fs/cgroup"+cgroupBase) {
		var dirs []string
		_ = filepath.WalkDir(r, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}

func viaSandbox(ctx context.Context, sb *sandbox.Sandbox, rootfs string, sec sandbox.Security, rt sandbox.RuntimeName, i int) error {
	sec.Runtime = rt
	h, err := sb.Run(ctx, sandbox.TaskSpec{ID: fmt.Sprintf("bench-%s-%d", rt, i), Rootfs: rootfs, Args: []string{"/bin/true"}}, sec, sandbox.Stdio{})
	if err != nil {
		return err
	}
	st, err := h.Wait(ctx)
	if derr := h.Delete(ctx); err == nil {
		err = derr
	}
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("exit %d", st.Code)
	}
	return err
}

func podmanCmd(args ...string) *exec.Cmd {
	return exec.Command("podman", append([]string{"--root", podmanDir + "/root", "--runroot", podmanDir + "/runroot",
		"--cgroup-manager=cgroupfs", "--events-backend=file"}, args...)...)
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func makeRootfs(root string) error {
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		return err
	}
	return os.Symlink("busybox", filepath.Join(root, "bin/true"))
}
