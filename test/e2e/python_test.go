package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/pelletier/go-toml/v2"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/packaging/images/imagebuild"
)

// TestPythonSDK runs the Python SDK's tests (sdk/python/tests, unittest)
// against the real stack: two machines in the default pool, the registry
// as worker.imageRegistry (image builds and blobs) and as the base image
// registry, where the levers9-runner image (Debian with Python, built from
// the cached root filesystem as `make images` builds it) is pushed as
// levers9-runner:latest. The Python tests read the CLI's context file
// (LEVERS9_HOME) and run with LEVERS9_TEST_STACK=1: .remote() returns a
// value computed in a container, a remote exception comes back with its
// traceback, .map() over 50 inputs keeps order and its concurrency bound,
// a looser security env raises before submit, and a task whose agent is
// SIGKILLed mid-run completes on the other machine; the agent is
// restarted here afterwards.
func TestPythonSDK(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "python3", "runc")
	python := requirePython311(t)
	start := time.Now()
	runner := make(chan error, 1)
	var pushed string
	w := setupTaskWorldWith(t, func(c *config.Config, w *taskWorld) {
		c.Worker.ImageRegistry = w.registry
		c.ImageService.Runner.BaseImageRegistry = w.registry
		// The killed agent's attempt is lost (and retried) after this.
		c.Controlplane.LostAgentGrace = "8s"
		// The runner image builds and pushes while the agents start.
		go func() {
			var err error
			pushed, err = pushRunnerImage(w.registry)
			runner <- err
		}()
	})
	select {
	case err := <-runner:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the runner image was not pushed within 3 minutes")
	}
	t.Logf("stack ready and %s pushed after %s", pushed, time.Since(start).Round(time.Second))

	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	env := pythonEnv(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-W", "error", "-m", "unittest", "discover", "-s",
		filepath.Join(repo, "sdk", "python", "tests"), "-v")
	cmd.Dir = t.TempDir()
	cmd.Env = env
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var lines sync.WaitGroup
	lines.Add(1)
	go func() {
		defer lines.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			t.Log("python: " + sc.Text())
		}
	}()
	pyStart := time.Now()
	runErr := cmd.Run()
	pw.Close()
	lines.Wait()
	t.Logf("python tests took %s", time.Since(pyStart).Round(time.Second))

	// The SIGKILLed agent left its container's mounts and state: an agent
	// started again on its state directory cleans them up.
	for id, m := range w.runs {
		if agentRunning(id) {
			continue
		}
		t.Logf("restarting the agent of %s", id)
		w.startAgent(t, m)
		controlplanetest.Eventually(t, 60*time.Second, "the restarted agent online", func() bool {
			for _, lm := range w.machines(t) {
				if lm.ID == id {
					return lm.State == "MACHINE_STATE_ONLINE"
				}
			}
			return false
		})
	}
	if runErr != nil {
		for i, l := range w.agentLogs {
			t.Logf("agent log %d (end):\n%s", i, tail(l.String(), 60))
		}
		t.Fatalf("python tests: %v", runErr)
	}
}

// requirePython311 returns python3's path, skipping (failing under CI) when
// it is older than 3.11 (the SDK reads TOML with tomllib).
func requirePython311(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(p, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])").Output()
	if err != nil {
		t.Fatalf("python3 version: %v", err)
	}
	var major, minor int
	if _, err := fmt.Sscan(string(out), &major, &minor); err != nil || major < 3 || (major == 3 && minor < 11) {
		testenv.Missing(t, "python3 3.11 or later (have %q)", strings.TrimSpace(string(out)))
	}
	return p
}

// pushRunnerImage builds levers9-runner from the cached root filesystem
// (built with mmdebstrap when missing) and pushes it as
// registry/levers9-runner:latest.
func pushRunnerImage(registry string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cache, err := imagebuild.CacheRoot()
	if err != nil {
		return "", err
	}
	log := &testenv.SyncBuffer{}
	img, err := imagebuild.Build(ctx, "runner", imagebuild.Options{CacheDir: cache, Created: time.Unix(0, 0), Log: log})
	if err != nil {
		return "", fmt.Errorf("build levers9-runner: %w\n%s", err, log)
	}
	ref, err := name.ParseReference(registry+"/levers9-runner:latest", name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img.Image, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref.String(), nil
}

// pythonEnv is the environment of the Python tests: this one without
// LEVERS9_* variables that would override the context file, plus the
// world's LEVERS9_HOME, LEVERS9_TEST_STACK=1, and LEVERS9_REST when the
// context does not hold the REST address.
func pythonEnv(t *testing.T, w *taskWorld) []string {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "LEVERS9_") || k == "PYTHONPATH" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "LEVERS9_HOME="+w.home, "LEVERS9_TEST_STACK=1", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	b, err := os.ReadFile(filepath.Join(w.home, "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Current  string                    `toml:"current"`
		Contexts map[string]map[string]any `toml:"contexts"`
	}
	if err := toml.Unmarshal(b, &f); err != nil {
		t.Fatalf("the world's config.toml: %v", err)
	}
	if rest, _ := f.Contexts[f.Current]["rest"].(string); rest == "" {
		env = append(env, "LEVERS9_REST="+w.in.Server.RESTAddr())
	}
	return env
}

// agentRunning reports whether a `levers9-agent run` process serves
// machineID (agentPID's search, without failing the test).
func agentRunning(machineID string) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), "levers9-agent\x00run\x00") {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i, a := range args {
			if a == "--state-dir" && i+1 < len(args) {
				id, err := os.ReadFile(filepath.Join(args[i+1], "machine-id"))
				if err == nil && strings.TrimSpace(string(id)) == machineID {
					return true
				}
			}
		}
	}
	return false
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
