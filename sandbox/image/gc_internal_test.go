package image

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestEvictSparesBlobsOfPullsInProgress pins the race where a pull finds a
// shared layer already cached and GC evicts the only image recording it
// before the pull has unpacked it.
func TestEvictSparesBlobsOfPullsInProgress(t *testing.T) {
	t.Parallel()
	s, err := New(Config{Root: t.TempDir(), Registry: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	blob := func(content string) v1.Hash {
		h := v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sha256.Sum256([]byte(content)))}
		if err := os.WriteFile(s.blobPath(h.Hex), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return h
	}
	manifest, config, shared := blob("manifest"), blob("config"), blob("shared layer")
	rec := record{Digest: manifest.String(), Config: config.String(), Layers: []string{shared.String()}, Blobs: []blobRecord{
		{Digest: manifest.String(), Size: 8}, {Digest: config.String(), Size: 6}, {Digest: shared.String(), Size: 12},
	}}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(s.recordPath(manifest.Hex), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(s.rootfsPath(manifest.Hex), 0o755); err != nil {
		t.Fatal(err)
	}

	release := s.claimBlobs([]v1.Descriptor{{Digest: shared}})
	evicted, err := s.evict(manifest.Hex)
	release()
	if err != nil || !evicted {
		t.Fatalf("evict = %v, %v", evicted, err)
	}
	if _, err := os.Stat(s.blobPath(shared.Hex)); err != nil {
		t.Errorf("blob claimed by a pull in progress was deleted: %v", err)
	}
	for _, h := range []v1.Hash{manifest, config} {
		if _, err := os.Stat(s.blobPath(h.Hex)); !os.IsNotExist(err) {
			t.Errorf("unclaimed blob %s kept: %v", h, err)
		}
	}
	if _, err := os.Stat(s.rootfsPath(manifest.Hex)); !os.IsNotExist(err) {
		t.Errorf("rootfs kept: %v", err)
	}
}
