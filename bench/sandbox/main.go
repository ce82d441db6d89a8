// Command sandbox benchmarks container start-to-exit of a trivial command
// (/bin/true in a busybox rootfs) through the sandbox package with runc and
// runsc, against a bare `runc run` of the same bundle and a `podman run
// --rootfs` of the same rootfs, interleaved in one run. It prints medians
// of per-iteration ratios; its last line is
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

	"github.com/levers9/levers9/sandbox"
)

const (
	stateDir   = "/run/l9s-bench"
	podmanDir  = "/run/l9s-bench-podman"
	cgroupBase = "/l9s-bench"
)

func main() {
	quick := flag.Bool("quick", false, "fewer iterations (about a minute)")
	n := flag.Int("n", 30, "iterations")
	flag.Parse()
	if *quick {
		*n = 8
	}
	if err := run(*n); err != nil {
		log.Fatal(err)
	}
}

func run(n int) error {
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
	sb, err := sandbox.New(sandbox.Config{StateDir: stateDir, CgroupParent: cgroupBase, Host: host})
	if err != nil {
		return err
	}
	defer os.RemoveAll(podmanDir)
	defer os.RemoveAll(stateDir)
	defer func() {
		_ = sb.Reconcile(context.Background())
		// podman's (conmon included) and the bare run's cgroups under
		// our parent, deepest first; rmdir refuses any still in use.
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
	}()
	if err := sb.Reconcile(ctx); err != nil {
		return err
	}
	sec := sandbox.Security{Profile: sandbox.ProfileHardened, Seccomp: sandbox.SeccompEnforce, DropNetRaw: true}

	// The bare bundle is the very spec the sandbox would run.
	task := sandbox.TaskSpec{ID: "bare", Rootfs: rootfs, Args: []string{"/bin/true"}}
	spec, _, err := sandbox.BuildSpec(task, sec.WithDefaults(), host)
	if err != nil {
		return err
	}
	spec.Linux.CgroupsPath = cgroupBase + "/l9s-bench-bare"
	bareBundle := filepath.Join(work, "bare")
	if err := os.MkdirAll(bareBundle, 0o700); err != nil {
		return err
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bareBundle, "config.json"), b, 0o600); err != nil {
		return err
	}

	variants := []struct {
		name string
		fn   func(i int) error
	}{
		{"sandbox_runc", func(i int) error { return viaSandbox(ctx, sb, rootfs, sec, sandbox.RuntimeRunc, i) }},
		{"bare_runc", func(i int) error {
			return exec.Command("runc", "--root", stateDir+"/bare-root", "run", "--bundle", bareBundle, fmt.Sprintf("l9s-bench-bare-%d", i)).Run()
		}},
		{"sandbox_runsc", func(i int) error { return viaSandbox(ctx, sb, rootfs, sec, sandbox.RuntimeRunsc, i) }},
		{"podman", func(i int) error {
			return exec.Command("podman", "--root", podmanDir+"/root", "--runroot", podmanDir+"/runroot",
				"--cgroup-manager=cgroupfs", "--events-backend=file", "run", "--rm", "--network", "none",
				"--cgroup-parent", cgroupBase+"/podman", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
				"--rootfs", rootfs, "/bin/true").Run()
		}},
	}
	// One warm-up of each, then n interleaved rounds with the order
	// rotating so no variant always runs first.
	times := map[string][]time.Duration{}
	for round := -1; round < n; round++ {
		for k := range variants {
			v := variants[(k+max(round, 0))%len(variants)]
			start := time.Now()
			if err := v.fn(round + 1); err != nil {
				return fmt.Errorf("%s round %d: %w", v.name, round, err)
			}
			if round >= 0 {
				times[v.name] = append(times[v.name], time.Since(start))
			}
		}
	}
	for _, v := range variants {
		fmt.Printf("%-14s median %v\n", v.name, median(times[v.name]))
	}
	ratio := func(a, b string) float64 {
		r := make([]float64, n)
		for i := range r {
			r[i] = float64(times[a][i]) / float64(times[b][i])
		}
		sort.Float64s(r)
		return r[len(r)/2]
	}
	fmt.Printf("runc_vs_bare=%.3f runsc_vs_bare=%.3f runc_vs_podman=%.3f\n",
		ratio("sandbox_runc", "bare_runc"), ratio("sandbox_runsc", "bare_runc"), ratio("sandbox_runc", "podman"))
	return nil
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
