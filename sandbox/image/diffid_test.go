package image_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/levers9/levers9/sandbox/image"
)

// TestPullRefusesAConfigWhoseDiffIDsLie: the layer blob matches its digest,
// but the config (which the manifest digest covers) names other content.
func TestPullRefusesAConfigWhoseDiffIDsLie(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	data := rawTar(t, []entry{{name: "f", data: "content"}})
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	lie := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	cf.RootFS.DiffIDs[0] = lie
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(b.reg.Host + "/l9i/diffid:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	_, err = b.store.Pull(ctx, "l9i/diffid:v1")
	if !errors.Is(err, image.ErrDigestMismatch) || !strings.Contains(err.Error(), lie.String()) {
		t.Fatalf("Pull = %v, want ErrDigestMismatch naming the diff_id %s", err, lie)
	}
}
