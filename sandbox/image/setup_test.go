package image_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/imagetest"
)

// mountSource names this package's test mounts so TestMain can remove what
// a killed run left.
const mountSource = "l9i-test"

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		if err := imagetest.ReconcileMounts(mountSource); err != nil {
			fmt.Fprintln(os.Stderr, "reconcile:", err)
		}
	}
	os.Exit(m.Run())
}

type bundle struct {
	reg     *imagetest.Registry
	root    string
	metrics *prometheus.Registry
	logs    *testenv.SyncBuffer
	clock   *clock.Fake
	store   *image.Store
}

type setupOpts struct {
	users map[string]string
	cfg   func(*image.Config)
}

func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	reg := imagetest.StartRegistry(t, imagetest.RegistryOptions{Users: o.users})
	root, err := os.MkdirTemp("", "l9i-store-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	b := &bundle{reg: reg, root: root, logs: &testenv.SyncBuffer{}, clock: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	b.store, b.metrics = b.newStore(t, o.cfg)
	return b
}

// newStore opens another Store on the same root (as another agent process
// would), with its own metrics registry.
func (b *bundle) newStore(t *testing.T, mutate func(*image.Config)) (*image.Store, *prometheus.Registry) {
	t.Helper()
	pr := prometheus.NewRegistry()
	cfg := image.Config{
		Root:               b.root,
		Registry:           b.reg.Host,
		InsecureRegistries: []string{b.reg.Host},
		MountSource:        mountSource,
		Logger:             slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer:         pr,
		Clock:              b.clock,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := image.New(cfg)
	if err != nil {
		t.Fatalf("image.New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Reconcile(context.Background(), nil); err != nil {
			t.Errorf("reconcile: %v", err)
		}
	})
	return s, pr
}

func pushBusybox(t *testing.T, host, repo, tag string, extra []build.File) build.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := build.BuildBusybox(ctx, host, repo, tag, extra, build.Options{})
	if err != nil {
		t.Fatalf("build busybox image: %v", err)
	}
	return res
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// metricValue sums the counter or gauge name whose labels include want.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if m.Counter != nil {
				sum += m.Counter.GetValue()
			}
			if m.Gauge != nil {
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

// manifestLayers returns the config digest and the layer digests of the
// image digestRef, read straight from the registry.
func manifestLayers(t *testing.T, host, digestRef string) []string {
	t.Helper()
	ref, err := name.ParseReference(digestRef)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("read %s from %s: %v", digestRef, host, err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	out := []string{m.Config.Digest.String()}
	for _, l := range m.Layers {
		out = append(out, l.Digest.String())
	}
	return out
}
