package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// TestImageBuilds walks an image through its generations: a new recipe
// starts a build, a second caller joins it, a failed build is followed by
// a new generation, a ready image is cached (force starts again), and the
// end of an old generation is ignored. Another workspace sees none of it.
func TestImageBuilds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws, other := newWorkspace(t, st), newWorkspace(t, st)
	key := func(gen int) string { return fmt.Sprintf("levers9-build.h1.%d", gen) }
	want := store.Image{WorkspaceID: ws.ID, Hash: "sha256:h1", Recipe: []byte(`{"base":"b"}`), Base: "reg/b@sha256:x",
		BaseDigest: "sha256:x", Steps: 3, StartStep: 1, Parent: "reg/levers9/images@sha256:s0"}

	steps := []struct {
		name    string
		force   bool
		before  func(t *testing.T)
		wantDec store.BuildDecision
		wantGen int
	}{
		{name: "new recipe starts", wantDec: store.BuildStarted, wantGen: 1},
		{name: "a second caller joins", wantDec: store.BuildJoined, wantGen: 1},
		{name: "after a failure a new generation starts", before: func(t *testing.T) {
			if _, ok, err := st.FinishImageBuild(ctx, ws.ID, want.Hash, key(1), store.ImageEnd{Error: "build failed: exit 3", At: time.Now()}); err != nil || !ok {
				t.Fatalf("finish gen 1: %v %v", ok, err)
			}
		}, wantDec: store.BuildStarted, wantGen: 2},
		{name: "the old generation's end is ignored", before: func(t *testing.T) {
			if _, ok, err := st.FinishImageBuild(ctx, ws.ID, want.Hash, key(1), store.ImageEnd{Ready: true, At: time.Now()}); err != nil || ok {
				t.Fatalf("finish of a replaced generation: ok=%v %v", ok, err)
			}
		}, wantDec: store.BuildJoined, wantGen: 2},
		{name: "a ready image is cached", before: func(t *testing.T) {
			end := store.ImageEnd{Ready: true, Digest: "sha256:d", Ref: "reg/levers9/images@sha256:d", At: time.Now(),
				Steps: map[string]string{"k1": "sha256:s1", "k2": "sha256:s2"}}
			if img, ok, err := st.FinishImageBuild(ctx, ws.ID, want.Hash, key(2), end); err != nil || !ok || img.State != store.ImageReady {
				t.Fatalf("finish gen 2: %+v %v %v", img, ok, err)
			}
		}, wantDec: store.BuildCached, wantGen: 2},
		{name: "force builds again", force: true, wantDec: store.BuildStarted, wantGen: 3},
	}
	for _, s := range steps {
		if s.before != nil {
			s.before(t)
		}
		img, dec, err := st.BeginImageBuild(ctx, want, s.force, key)
		if err != nil || dec != s.wantDec || img.Generation != s.wantGen || img.BuildKey != key(s.wantGen) {
			t.Fatalf("%s: decision %v generation %d key %q, %v; want %v %d", s.name, dec, img.Generation, img.BuildKey, err, s.wantDec, s.wantGen)
		}
	}
	if err := st.SetImageTask(ctx, ws.ID, want.Hash, key(3), "t_build3"); err != nil {
		t.Fatal(err)
	}
	if img, err := st.ImageByBuildKey(ctx, ws.ID, key(3)); err != nil || img.TaskID != "t_build3" || img.State != store.ImageBuilding {
		t.Fatalf("by build key: %+v %v", img, err)
	}
	if _, err := st.ImageByBuildKey(ctx, ws.ID, key(2)); !errdefs.IsNotFound(err) {
		t.Fatalf("a replaced generation's key: %v, want not found", err)
	}
	if err := st.DeleteImage(ctx, ws.ID, want.Hash, nil); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete while building: %v, want failed precondition", err)
	}

	// The steps gen 2 recorded: only a prefix of the keys counts.
	for _, c := range []struct {
		keys   []string
		want   int
		digest string
	}{
		{[]string{"k1", "k2", "k3"}, 1, "sha256:s2"},
		{[]string{"k1", "kx", "k2"}, 0, "sha256:s1"},
		{[]string{"kx", "k1"}, -1, ""},
	} {
		got, d, err := st.DeepestImageStep(ctx, ws.ID, c.keys)
		if err != nil || got != c.want || d != c.digest {
			t.Errorf("deepest of %v = %d %q %v, want %d %q", c.keys, got, d, err, c.want, c.digest)
		}
	}
	if got, _, err := st.DeepestImageStep(ctx, other.ID, []string{"k1", "k2"}); err != nil || got != -1 {
		t.Fatalf("another workspace's steps: %d %v, want -1", got, err)
	}
	if _, err := st.GetImage(ctx, other.ID, want.Hash); !errdefs.IsNotFound(err) {
		t.Fatalf("another workspace's image: %v", err)
	}
	if list, err := st.ListImages(ctx, other.ID); err != nil || len(list) != 0 {
		t.Fatalf("another workspace's list: %v %v", list, err)
	}

	// Once it ended, a delete forgets it and the steps it names.
	if _, ok, err := st.FinishImageBuild(ctx, ws.ID, want.Hash, key(3), store.ImageEnd{Error: "cancelled", At: time.Now()}); err != nil || !ok {
		t.Fatalf("finish gen 3: %v %v", ok, err)
	}
	if err := st.DeleteImage(ctx, ws.ID, want.Hash, []string{"k1"}); err != nil {
		t.Fatal(err)
	}
	if got, d, err := st.DeepestImageStep(ctx, ws.ID, []string{"k2"}); err != nil || got != 0 || d != "sha256:s2" {
		t.Fatalf("a step the deleted recipe did not name: %d %q %v", got, d, err)
	}
	if _, err := st.GetImage(ctx, ws.ID, want.Hash); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted image: %v", err)
	}
}

// TestImageBuildRace: callers that begin one new recipe at once get one
// started build and joins, never two generations.
func TestImageBuildRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws := newWorkspace(t, st)
	want := store.Image{WorkspaceID: ws.ID, Hash: "sha256:race", Recipe: []byte(`{}`), Base: "b", BaseDigest: "sha256:x"}
	var mu sync.Mutex
	decs := map[store.BuildDecision]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, dec, err := st.BeginImageBuild(ctx, want, false, func(gen int) string { return fmt.Sprintf("levers9-build.race.%d", gen) })
			if err != nil || img.Generation != 1 {
				t.Errorf("begin: %+v %v", img, err)
			}
			mu.Lock()
			decs[dec]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if decs[store.BuildStarted] != 1 || decs[store.BuildJoined] != 7 {
		t.Fatalf("decisions %v, want 1 started and 7 joined", decs)
	}
}

// TestImageBlobs: a blob is the workspace's that uploaded it.
func TestImageBlobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws, other := newWorkspace(t, st), newWorkspace(t, st)
	const d = "sha256:0123"
	for range 2 { // a second upload of the same content is no error
		if err := st.PutImageBlob(ctx, ws.ID, d, 42); err != nil {
			t.Fatal(err)
		}
	}
	if size, err := st.ImageBlob(ctx, ws.ID, d); err != nil || size != 42 {
		t.Fatalf("own blob: %d %v", size, err)
	}
	if _, err := st.ImageBlob(ctx, other.ID, d); !errdefs.IsNotFound(err) {
		t.Fatalf("another workspace's blob: %v, want not found", err)
	}
}
