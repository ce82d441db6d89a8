package image_test

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/sandbox/image/build"
)

// TestPullMountGCStress runs pulls, mounts and GC of three images at once
// under a budget that fits one, with no grace period, so every pull evicts
// the others while tasks keep mounting them. Nothing may deadlock, no
// mounted image may lose its lower directory, and the only tolerated
// failure is Mount finding its image already collected.
func TestPullMountGCStress(t *testing.T) {
	testenv.RequireRoot(t)
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	for _, n := range []string{"a", "b", "c"} {
		noise := make([]byte, 64<<10)
		_, _ = rand.Read(noise)
		pushBusybox(t, b.reg.Host, "l9i/stress-"+n, "v1", []build.File{{Path: "noise", Mode: 0o644, Data: noise}})
	}
	s, metrics := b.newStore(t, func(c *image.Config) { c.DiskBudget, c.GCGrace = 1, time.Nanosecond })

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4 {
				b.clock.Advance(time.Second)
				n := string("abc"[(w+i)%3])
				img, err := s.Pull(ctx, "l9i/stress-"+n+":v1")
				if err != nil {
					errs <- fmt.Errorf("worker %d: pull %s: %w", w, n, err)
					return
				}
				root, cleanup, err := s.Mount(ctx, img.Digest, fmt.Sprintf("l9i-stress-%d-%d", w, i))
				if errdefs.IsNotFound(err) {
					continue // collected between Pull and Mount: allowed with no grace
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d: mount %s: %w", w, n, err)
					return
				}
				if _, err := s.GC(ctx); err != nil {
					errs <- fmt.Errorf("worker %d: gc: %w", w, err)
				}
				// The lower must still be there under a mounted task.
				if data, err := os.ReadFile(filepath.Join(root, "etc/passwd")); err != nil || !strings.HasPrefix(string(data), "root:") {
					errs <- fmt.Errorf("worker %d: read through mount of %s: %q, %v", w, n, data, err)
				}
				if _, err := os.Stat(img.RootFS); err != nil {
					errs <- fmt.Errorf("worker %d: lower of mounted %s collected: %v", w, n, err)
				}
				if err := cleanup(); err != nil {
					errs <- fmt.Errorf("worker %d: cleanup: %w", w, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	evictions := metricValue(t, metrics, "levers9_image_gc_evictions_total", nil)
	fetched := metricValue(t, metrics, "levers9_image_pulls_total", map[string]string{"result": "fetched"})
	t.Logf("evictions=%v fetched=%v", evictions, fetched)
	if evictions == 0 || fetched <= 3 {
		t.Errorf("evictions=%v fetched=%v: the stress never made GC evict and pulls refetch", evictions, fetched)
	}
	if ents, _ := os.ReadDir(filepath.Join(b.root, "tasks")); len(ents) != 0 {
		t.Errorf("task dirs left: %v", ents)
	}
	// Every record left has its lower directory.
	recs, _ := os.ReadDir(filepath.Join(b.root, "images"))
	for _, r := range recs {
		hex := strings.TrimSuffix(r.Name(), ".json")
		if _, err := os.Stat(filepath.Join(b.root, "rootfs", hex)); err != nil {
			t.Errorf("record %s without rootfs: %v", hex, err)
		}
	}
}
