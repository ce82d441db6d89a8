// Command images benchmarks levers9's image builds from recipes end to end
// on this machine, each figure against a baseline measured in the same run.
//
// The stack is real and private, as in bench/tasks (internal/benchstack):
// Postgres, Redis and a docker-registry on free loopback ports under a
// temporary directory, a controlplane whose worker.imageRegistry is that
// registry (builds push there, copy steps' blobs are kept there), and two
// agents in this process, one in the "build" pool (which the image service
// sends builds to) and one in "default" (which runs tasks), both without
// the egress network. Everything is removed at the end, also on error or
// interrupt.
//
// Every round builds a fresh recipe through the SDK (Client.BuildImage)
// on a busybox base pushed to the registry: an env step, a copy of a small
// local directory (a 256 KiB random file and a nonce file) and a run step
// writing a file. All three carry the round's nonce (the env value, a
// copied file, the command), so no step is cached: the build is cold.
// Measured per round:
//
//   - the cold build: from BuildImage's call (pack and upload the copy
//     source, submit) until Client.Image says READY, which the bench asks
//     once the build task has ended (followed with Client.Follow). The
//     build's own log lines (step markers, the run step's output, the
//     pushed image) time where the build spends it, by the agent's clock;
//   - the cached build: BuildImage of the same recipe again, which must
//     answer Cached, to its return;
//   - the first run of a task (`echo hi`, submit to first output line at a
//     follower, as bench/tasks measures) on the image just built, against
//     the same on a pre-pushed image of the same shape: the busybox base
//     layer plus a layer like the copy step's (a fresh 256 KiB random file)
//     and one like the run step's, pushed with go-containerregistry under
//     a new digest each round. The task agent has pulled neither before
//     (builds run on the other agent) and holds the base layer's blob
//     from warm-up tasks, so both sides fetch two new layers and unpack an
//     image; the order of the two alternates between rounds;
//   - baselines for the build: a bare `runc run` to its exit of the run
//     step's command in a busybox bundle with the default pool's hardened
//     spec and seccomp profile (the bundle bench/tasks uses; the recipe has
//     one run step, and env and copy steps run no container), and a
//     trivial levers9 task on the warm base image from submit to its end.
//
// Reading the ratios: a cold build must at least run its one container,
// so build_vs_bare_runc is what a build costs over that floor (the agent
// also pulls and unpacks the image so far for the run step, captures the
// step's changes as a layer and pushes three step images and the result);
// build_vs_task compares it with the cheapest levers9 task. A cached
// build still packs and stats the copy source and resolves the base's tag
// at the registry (the recipe's identity includes the base's digest).
//
// One build before the rounds warms the build agent and the paths (the
// base image's blob, the first pushes); it is printed, not counted. Its
// last line is
//
//	build_s_cold=… build_ms_cached=… first_run_vs_prepushed=… build_vs_bare_runc=… build_vs_task=…
//
// with medians over the rounds: build_s_cold in seconds, build_ms_cached in
// milliseconds, first_run_vs_prepushed the ratio of first-line medians
// (built / pre-pushed), build_vs_bare_runc and build_vs_task the cold
// build's median over the baseline's. Needs root and runc.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/levers9/levers9/internal/benchstack"
	"github.com/levers9/levers9/sdk"
)

func main() {
	quick := flag.Bool("quick", false, "5 rounds (under a minute)")
	rounds := flag.Int("n", 20, "rounds (each: one cold build, one cached build, one first run on each image)")
	flag.Parse()
	if *quick {
		*rounds = 5
	}
	if *rounds < 1 {
		log.Fatal("-n must be at least 1")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *rounds)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// figures are one run's measurements, one entry per round.
type figures struct {
	cold, cached               []time.Duration
	phases                     [][]time.Duration // per phase of phaseNames, per round
	builtFirst, prepushedFirst []time.Duration
	warmFirst, warmEnd         []time.Duration
	bareRunc                   []time.Duration
}

// pools are the agents' pools, one agent each: builds go to "build" (the
// image service prefers that pool when it exists), tasks to "default",
// so the agent that runs tasks never saw a built image before its task.
var pools = []string{"build", "default"}

func run(ctx context.Context, rounds int) error {
	s, err := benchstack.Start(ctx, benchstack.Options{Name: "l9i", Pools: pools, BuildRegistry: true})
	if err != nil {
		return fmt.Errorf("start the stack: %w", err)
	}
	defer s.Close()
	c, err := sdk.NewClient(ctx, sdk.WithConn(s.Conn, s.Token))
	if err != nil {
		return fmt.Errorf("sdk client: %w", err)
	}
	defer c.Close()
	b := &bench{s: s, c: c}
	if b.bare, err = s.BareBundle(ctx); err != nil {
		return fmt.Errorf("bare runc bundle: %w", err)
	}
	if b.baseLayer, err = busyboxLayer(); err != nil {
		return err
	}
	// The task agent caches the base image (whose layer both images of the
	// first-run comparison share) and warms its paths.
	for i := 0; i < 3; i++ {
		if _, _, err := s.FirstLine(s.Image); err != nil {
			return fmt.Errorf("warm-up task: %w", err)
		}
	}
	warm, err := b.round(ctx, -1, nil)
	if err != nil {
		return fmt.Errorf("warm-up build: %w", err)
	}
	f := &figures{phases: make([][]time.Duration, len(phaseNames))}
	var sizes string
	for r := 0; r < rounds; r++ {
		if sizes, err = b.round(ctx, r, f); err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
	}
	f.print(warm, sizes)
	return nil
}

// round runs one round, adding its figures to f; with f nil (the warm-up)
// it only builds and returns the build time. Otherwise it returns the two
// images' sizes.
func (b *bench) round(ctx context.Context, r int, f *figures) (string, error) {
	nonce, err := randomHex(8)
	if err != nil {
		return "", err
	}
	rec, dir, err := b.recipe(nonce)
	if err != nil {
		return "", err
	}
	img, bt, err := b.coldBuild(ctx, rec, dir)
	if err != nil {
		return "", fmt.Errorf("cold build: %w", err)
	}
	if f == nil {
		return fmt.Sprintf("%.2f s", bt.total.Seconds()), nil
	}
	f.cold = append(f.cold, bt.total)
	for i, d := range bt.phases {
		f.phases[i] = append(f.phases[i], d)
	}
	d, err := b.cachedBuild(ctx, rec, dir, img.Hash)
	if err != nil {
		return "", fmt.Errorf("cached build: %w", err)
	}
	f.cached = append(f.cached, d)
	pre, err := b.pushPrepushed(ctx, r, nonce)
	if err != nil {
		return "", fmt.Errorf("pre-pushed image: %w", err)
	}
	if d, err = bareRun(b.bare, r, nonce); err != nil {
		return "", fmt.Errorf("bare runc: %w", err)
	}
	f.bareRunc = append(f.bareRunc, d)
	order := []string{"built", "prepushed"}
	if r%2 == 1 {
		order = []string{"prepushed", "built"}
	}
	for _, which := range order {
		ref, into := img.Ref, &f.builtFirst
		if which == "prepushed" {
			ref, into = pre, &f.prepushedFirst
		}
		first, _, err := b.s.FirstLine(ref)
		if err != nil {
			return "", fmt.Errorf("first run on the %s image %s: %w", which, ref, err)
		}
		*into = append(*into, first)
	}
	first, end, err := b.s.FirstLine(b.s.Image)
	if err != nil {
		return "", fmt.Errorf("task on the warm base image: %w", err)
	}
	f.warmFirst, f.warmEnd = append(f.warmFirst, first), append(f.warmEnd, end)
	return sizesOf(ctx, img.Ref, pre)
}

func (f *figures) print(warm, sizes string) {
	n := len(f.cold)
	fmt.Printf("warm-up build (the run's first, not counted): %s\n", warm)
	fmt.Printf("cold build       median %.2f s over %d (min %.2f, max %.2f)\n", med(f.cold).Seconds(), n, minOf(f.cold).Seconds(), maxOf(f.cold).Seconds())
	parts := make([]string, len(phaseNames))
	for i, name := range phaseNames {
		parts[i] = fmt.Sprintf("%s %s", name, ms(med(f.phases[i])))
	}
	fmt.Printf("  where it goes (medians): %s\n", strings.Join(parts, "; "))
	fmt.Printf("cached build     median %s over %d (BuildImage answered Cached)\n", ms(med(f.cached)), n)
	fmt.Printf("first line       built image %s, pre-pushed image %s (both never pulled by the task agent); warm base image %s\n",
		ms(med(f.builtFirst)), ms(med(f.prepushedFirst)), ms(med(f.warmFirst)))
	fmt.Printf("baselines        bare runc run of the run step to its exit %s; levers9 task on the warm base image to its end %s\n",
		ms(med(f.bareRunc)), ms(med(f.warmEnd)))
	fmt.Printf("image sizes      %s\n", sizes)
	fmt.Printf("build_s_cold=%.3f build_ms_cached=%.1f first_run_vs_prepushed=%.3f build_vs_bare_runc=%.1f build_vs_task=%.2f\n",
		med(f.cold).Seconds(), float64(med(f.cached))/float64(time.Millisecond),
		float64(med(f.builtFirst))/float64(med(f.prepushedFirst)),
		float64(med(f.cold))/float64(med(f.bareRunc)), float64(med(f.cold))/float64(med(f.warmEnd)))
}

// randomHex is n random bytes in hex.
func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// writeApp writes the copy step's source: app/nonce.txt and app/data.bin
// (copyBytes random bytes) under dir.
func writeApp(dir, nonce string) error {
	app := filepath.Join(dir, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		return err
	}
	data := make([]byte, copyBytes)
	if _, err := rand.Read(data); err != nil {
		return fmt.Errorf("random: %w", err)
	}
	return errors.Join(os.WriteFile(filepath.Join(app, "nonce.txt"), []byte(nonce+"\n"), 0o644),
		os.WriteFile(filepath.Join(app, "data.bin"), data, 0o644))
}
