package image_test

import (
	"runtime"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/sandbox/image/build"
)

func TestPullMultiPlatformIndex(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	native := pushBusybox(t, b.reg.Host, "l9i/multi", "native", nil)
	other := pushBusybox(t, b.reg.Host, "l9i/multi", "other", []build.File{{Path: "other", Mode: 0o644, Data: []byte("o")}})
	var idx v1.ImageIndex = empty.Index
	for _, c := range []struct {
		res  build.Result
		arch string
	}{{other, "l9i-other-arch"}, {native, runtime.GOARCH}} {
		ref, err := name.ParseReference(c.res.DigestRef)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(ref, remote.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: c.arch}}})
	}
	tag, err := name.NewTag(b.reg.Host + "/l9i/multi:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx, remote.WithContext(ctx)); err != nil {
		t.Fatalf("push index: %v", err)
	}
	idxDigest, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}

	img, err := b.store.Pull(ctx, "l9i/multi:v1")
	if err != nil || img.Digest != native.Digest {
		t.Fatalf("Pull(index) = %+v, %v; want the %s manifest %s", img, err, runtime.GOARCH, native.Digest)
	}
	wrongArch, _ := b.newStore(t, func(c *image.Config) { c.Architecture = "s390x" })
	if _, err := wrongArch.Pull(ctx, "l9i/multi:v1"); !errdefs.IsNotFound(err) {
		t.Errorf("Pull for a platform the index lacks = %v, want not found", err)
	}

	b.reg.Stop()
	offline, _ := b.newStore(t, func(c *image.Config) { c.Offline = true })
	for _, ref := range []string{"l9i/multi:v1", "l9i/multi@" + idxDigest.String()} {
		got, err := offline.Pull(ctx, ref)
		if err != nil || got.Digest != native.Digest {
			t.Errorf("offline Pull(%s) = %+v, %v; want %s", ref, got, err, native.Digest)
		}
	}
}
