package taskrun

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/imagetest"
)

// Host objects of these tests carry the l9r prefix.
const (
	testPrefix      = "l9r"
	testStateDir    = "/run/l9r-test"
	testCgroup      = "/l9r-test"
	testMountSource = "l9r-test"
)

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		if err := imagetest.ReconcileMounts(testMountSource); err != nil {
			fmt.Fprintln(os.Stderr, "reconcile mounts:", err)
		}
	}
	goleak.VerifyTestMain(m)
}

type bundle struct {
	reg    *imagetest.Registry
	image  build.Result
	sb     *sandbox.Sandbox
	store  *image.Store
	runner *Runner
	root   string // image cache root
	cfg    Config // runner's
}

type setupOpts struct {
	cfg func(*Config)
	// transport wraps the image cache's HTTP transport.
	transport func(http.RoundTripper) http.RoundTripper
}

// setup starts a registry with the busybox image, a sandbox, an image
// cache and a started Runner; leftovers of a killed run are reconciled
// first and everything again at cleanup.
func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc")
	ctx := testCtx(t)
	b := &bundle{reg: imagetest.StartRegistry(t, imagetest.RegistryOptions{})}
	var err error
	b.image, err = build.BuildBusybox(ctx, b.reg.Host, "l9r/busybox", "test", nil, build.Options{})
	if err != nil {
		t.Fatalf("build busybox image: %v", err)
	}
	host, err := sandbox.DetectHost(ctx, sandbox.NVIDIADiscovery{})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(testenv.LogWriter(t, "TASKRUN_TEST_LOGS"), &slog.HandlerOptions{Level: slog.LevelDebug}))
	b.sb, err = sandbox.New(sandbox.Config{Prefix: testPrefix, StateDir: testStateDir, CgroupParent: testCgroup, Host: host, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	b.root, err = os.MkdirTemp("", "l9r-images-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(b.root) })
	var rt http.RoundTripper
	if o.transport != nil {
		rt = o.transport(http.DefaultTransport.(*http.Transport).Clone())
	}
	b.store, err = image.New(image.Config{Root: b.root, Registry: b.reg.Host, InsecureRegistries: []string{b.reg.Host},
		MountSource: testMountSource, Logger: logger, Transport: rt})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Sandbox: b.sb, Images: b.store, KillGrace: 500 * time.Millisecond, Logger: logger,
		StateDir: filepath.Join(b.root, "attempts"), IODir: filepath.Join(b.root, "io")}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	b.cfg = cfg
	b.runner, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.runner.Reconcile(ctx); err != nil {
		t.Fatalf("reconcile before: %v", err)
	}
	if err := b.runner.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.runner.Stop()
		if lost, err := b.runner.Reconcile(context.Background()); err != nil || len(lost) != 0 {
			t.Errorf("reconcile after: %v, lost %+v", err, lost)
		}
	})
	return b
}

// task returns a busybox task running script.
func (b *bundle) task(id, script string) Task {
	return Task{ID: id, Attempt: 1, Pool: "default", Image: b.image.DigestRef,
		Args: []string{"/bin/sh", "-c", script}, Resources: sandbox.Resources{Pids: 64}}
}

// assertClean checks that nothing of the attempt is left on the host.
func (b *bundle) assertClean(t *testing.T, tk Task) {
	t.Helper()
	cid := b.sb.ContainerID(tk.runID())
	for _, p := range []string{
		filepath.Join(testStateDir, cid),
		filepath.Join(testStateDir, "bundles", cid),
		filepath.Join(b.root, "tasks", tk.runID()),
		filepath.Join(b.root, "attempts", tk.runID()+".json"),
		filepath.Join(b.root, "io", tk.runID()),
	} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind (stat: %v)", p, err)
		}
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), " "+testMountSource+" ") && strings.Contains(sc.Text(), "/tasks/"+tk.runID()+"/") {
			t.Errorf("mount left behind: %s", sc.Text())
		}
	}
}

// recorder collects an attempt's lines and events.
type recorder struct {
	// mu guards the fields below.
	mu     sync.Mutex
	lines  []LogLine
	events []Event
}

func (r *recorder) output() Output {
	return Output{
		Logs: LogSinkFunc(func(_ context.Context, l LogLine) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.lines = append(r.lines, l)
			return nil
		}),
		Events: func(e Event) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.events = append(r.events, e)
		},
	}
}

func (r *recorder) states() []State {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []State
	for _, e := range r.events {
		if e.Kind == EventState {
			if len(s) == 0 {
				s = append(s, e.From)
			}
			s = append(s, e.To)
		}
	}
	return s
}

func (r *recorder) event(kind EventKind) (Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Kind == kind {
			return e, true
		}
	}
	return Event{}, false
}

// running is the change to RUNNING (zero if there was none).
func (r *recorder) running() Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Kind == EventState && e.To == StateRunning {
			return e
		}
	}
	return Event{}
}

func (r *recorder) texts(s Stream) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.lines {
		if l.Stream == s {
			out = append(out, l.Text)
		}
	}
	return out
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
