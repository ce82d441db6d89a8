package layer

import (
	"bytes"
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// LayerFromBytes is Layer for a tar held in memory (b must not change),
// for tests only: the product always has the tar in a file.
func LayerFromBytes(b []byte) (v1.Layer, error) {
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompressionLevel(GzipLevel), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("layer from %d bytes: %w", len(b), err)
	}
	return l, nil
}
