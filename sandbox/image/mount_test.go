package image_test

import (
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/sandbox/image/build"
)

func isMounted(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

func TestMountGivesEachTaskAWritableOverlay(t *testing.T) {
	testenv.RequireRoot(t)
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	pushBusybox(t, b.reg.Host, "l9i/mount", "v1", nil)
	img, err := b.store.Pull(ctx, "l9i/mount:v1")
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	lowerPasswd, err := os.ReadFile(filepath.Join(img.RootFS, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}

	r1, clean1, err := b.store.Mount(ctx, img.Digest, "l9i-task1")
	if err != nil {
		t.Fatalf("Mount task1: %v", err)
	}
	t.Cleanup(func() { _ = clean1() })
	r2, clean2, err := b.store.Mount(ctx, img.Digest, "l9i-task2")
	if err != nil {
		t.Fatalf("Mount task2: %v", err)
	}
	t.Cleanup(func() { _ = clean2() })

	if err := os.WriteFile(filepath.Join(r1, "etc/passwd"), []byte("changed\n"), 0o644); err != nil {
		t.Fatalf("write through task1's overlay: %v", err)
	}
	if err := os.WriteFile(filepath.Join(r1, "tmp/new"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(r1, "bin/ls")); err != nil {
		t.Fatal(err)
	}

	checks := []struct {
		root, file string
		want       string // "" means absent
	}{
		{r1, "etc/passwd", "changed\n"},
		{r1, "tmp/new", "new"},
		{r1, "bin/ls", ""},
		{r2, "etc/passwd", string(lowerPasswd)},
		{r2, "tmp/new", ""},
		{r2, "bin/ls", "busybox"},
		{img.RootFS, "etc/passwd", string(lowerPasswd)},
		{img.RootFS, "tmp/new", ""},
		{img.RootFS, "bin/ls", "busybox"},
		{filepath.Join(b.root, "tasks/l9i-task1/upper"), "tmp/new", "new"},
	}
	for _, c := range checks {
		p := filepath.Join(c.root, c.file)
		var got string
		if st, err := os.Lstat(p); err == nil && st.Mode()&os.ModeSymlink != 0 {
			got, _ = os.Readlink(p)
		} else if data, err := os.ReadFile(p); err == nil {
			got = string(data)
		}
		if got != c.want {
			t.Errorf("%s = %q, want %q", p, got, c.want)
		}
	}

	// The overlay is a working root filesystem: busybox runs from it.
	out, err := exec.CommandContext(ctx, "chroot", r1, "/bin/sh", "-c", "echo ok > /tmp/ran && cat /tmp/ran /etc/passwd && test ! -e /bin/ls && echo gone").CombinedOutput()
	if err != nil || string(out) != "ok\nchanged\ngone\n" {
		t.Errorf("chroot %s sh = %q, %v; want ok, the changed passwd, and no /bin/ls", r1, out, err)
	}
	if _, _, err := b.store.Mount(ctx, img.Digest, "l9i-task1"); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second Mount of task1 = %v, want already exists", err)
	}
	for _, id := range []string{"", "..", "../l9i-x", "a/b", strings.Repeat("a", 129)} {
		if _, _, err := b.store.Mount(ctx, img.Digest, id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Mount(task %q) = %v, want invalid argument", id, err)
		}
	}
	if _, _, err := b.store.Mount(ctx, "sha256:"+strings.Repeat("1", 64), "l9i-task3"); !errdefs.IsNotFound(err) {
		t.Errorf("Mount of an unknown digest = %v, want not found", err)
	}

	if err := clean1(); err != nil {
		t.Fatalf("cleanup task1: %v", err)
	}
	if err := clean1(); err != nil {
		t.Errorf("second cleanup of task1: %v", err)
	}
	if isMounted(t, r1) {
		t.Errorf("%s still mounted after cleanup", r1)
	}
	if _, err := os.Stat(filepath.Join(b.root, "tasks/l9i-task1")); !os.IsNotExist(err) {
		t.Errorf("task1 dirs left: %v", err)
	}
	if !isMounted(t, r2) {
		t.Errorf("task2's mount went away with task1's cleanup")
	}
}

func TestGCEvictsLeastRecentlyUsedButNeverMounted(t *testing.T) {
	testenv.RequireRoot(t)
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	imgs := map[string]image.Image{}
	var unique = map[string]string{}
	for _, n := range []string{"a", "b", "c"} {
		noise := make([]byte, 256<<10)
		_, _ = rand.Read(noise)
		res := pushBusybox(t, b.reg.Host, "l9i/gc-"+n, "v1", []build.File{{Path: "noise", Mode: 0o644, Data: noise}})
		unique[n] = manifestLayers(t, b.reg.Host, res.DigestRef)[2]
	}
	pull := func(n string) {
		img, err := b.store.Pull(ctx, "l9i/gc-"+n+":v1")
		if err != nil {
			t.Fatalf("Pull %s: %v", n, err)
		}
		imgs[n] = img
		b.clock.Advance(time.Minute)
	}
	// a is used first and stays mounted, so it is the least recently used.
	pull("a")
	_, cleanA, err := b.store.Mount(ctx, imgs["a"].Digest, "l9i-gc-task")
	if err != nil {
		t.Fatalf("Mount a: %v", err)
	}
	t.Cleanup(func() { _ = cleanA() })
	b.clock.Advance(time.Minute)
	pull("b")
	pull("c")

	// Another Store (another process) with a tiny budget sees a's mount only
	// through mountinfo.
	gcStore, gcMetrics := b.newStore(t, func(c *image.Config) { c.DiskBudget, c.GCGrace = 1, 10*time.Minute })
	// Within the grace period nothing goes: an image between Pull and Mount
	// must survive.
	if res, err := gcStore.GC(ctx); err != nil || len(res.Evicted) != 0 {
		t.Fatalf("GC within the grace period = %+v, %v; want nothing evicted", res, err)
	}
	b.clock.Advance(time.Hour)
	res, err := gcStore.GC(ctx)
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if want := []string{imgs["b"].Digest, imgs["c"].Digest}; !slices.Equal(res.Evicted, want) {
		t.Fatalf("Evicted = %v, want %v (b then c, never the mounted a)", res.Evicted, want)
	}
	if got := metricValue(t, gcMetrics, "levers9_image_gc_evictions_total", nil); got != 2 {
		t.Errorf("evictions metric = %v, want 2", got)
	}
	for n, wantThere := range map[string]bool{"a": true, "b": false, "c": false} {
		_, err := os.Stat(imgs[n].RootFS)
		if (err == nil) != wantThere {
			t.Errorf("rootfs of %s present=%v, want %v", n, err == nil, wantThere)
		}
		_, err = os.Stat(filepath.Join(b.root, "blobs/sha256", strings.TrimPrefix(unique[n], "sha256:")))
		if (err == nil) != wantThere {
			t.Errorf("unique layer of %s present=%v, want %v", n, err == nil, wantThere)
		}
	}
	if _, err := gcStore.Get(ctx, imgs["a"].Digest); err != nil {
		t.Errorf("mounted image a gone: %v", err)
	}
	if _, err := b.store.Pull(ctx, "l9i/gc-a:v1"); err != nil {
		t.Errorf("Pull of a after GC: %v", err)
	}

	if err := cleanA(); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Hour)
	res, err = gcStore.GC(ctx)
	if err != nil || !slices.Equal(res.Evicted, []string{imgs["a"].Digest}) || res.UsedBytes != 0 {
		t.Errorf("GC after unmount = %+v, %v; want a evicted and nothing left", res, err)
	}
}

func TestGCAfterPullKeepsWithinBudget(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	for _, n := range []string{"a", "b", "c"} {
		noise := make([]byte, 256<<10)
		_, _ = rand.Read(noise)
		pushBusybox(t, b.reg.Host, "l9i/budget-"+n, "v1", []build.File{{Path: "noise", Mode: 0o644, Data: noise}})
	}
	probe, err := b.store.Pull(ctx, "l9i/budget-a:v1")
	if err != nil {
		t.Fatal(err)
	}
	// Two images (sharing the busybox layer) fit, three do not.
	budget := 2 * probe.Size
	s, _ := b.newStore(t, func(c *image.Config) { c.DiskBudget, c.GCGrace = budget, 30*time.Second })
	var digests []string
	for _, n := range []string{"b", "c", "a"} {
		b.clock.Advance(time.Minute)
		img, err := s.Pull(ctx, "l9i/budget-"+n+":v1")
		if err != nil {
			t.Fatalf("Pull %s: %v", n, err)
		}
		digests = append(digests, img.Digest)
	}
	// Pulling c evicted a (pulled first, by b.store); pulling a again then
	// evicted b, now the least recently used.
	res, err := s.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.UsedBytes > budget {
		t.Errorf("used %d bytes > budget %d", res.UsedBytes, budget)
	}
	var present []string
	for _, d := range digests {
		if _, err := s.Get(ctx, d); err == nil {
			present = append(present, d)
		}
	}
	if want := digests[1:]; !slices.Equal(present, want) {
		t.Errorf("cached = %v, want %v (b evicted as least recently used)", present, want)
	}
}

func TestReconcileRemovesLeftoversButKeepsLiveTasks(t *testing.T) {
	testenv.RequireRoot(t)
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	pushBusybox(t, b.reg.Host, "l9i/reconcile", "v1", nil)
	img, err := b.store.Pull(ctx, "l9i/reconcile:v1")
	if err != nil {
		t.Fatal(err)
	}
	// A killed agent left: a task mount, a partial download, and a lower
	// directory whose record was never written.
	deadRoot, deadClean, err := b.store.Mount(ctx, img.Digest, "l9i-dead")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deadClean() })
	liveRoot, liveClean, err := b.store.Mount(ctx, img.Digest, "l9i-live")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = liveClean() })
	junk := filepath.Join(b.root, "tmp", "blob-partial")
	orphan := filepath.Join(b.root, "rootfs", strings.Repeat("e", 64))
	for _, d := range []string{junk, orphan} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	restarted, _ := b.newStore(t, nil)
	if err := restarted.Reconcile(ctx, []string{"l9i-live"}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if isMounted(t, deadRoot) {
		t.Errorf("dead task's rootfs still mounted")
	}
	if !isMounted(t, liveRoot) {
		t.Errorf("live task's rootfs was unmounted")
	}
	for _, p := range []string{filepath.Join(b.root, "tasks/l9i-dead"), junk, orphan} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived Reconcile: %v", p, err)
		}
	}
	if _, err := restarted.Get(ctx, img.Digest); err != nil {
		t.Errorf("complete image lost by Reconcile: %v", err)
	}
}
