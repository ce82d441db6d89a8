package layer

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// GzipLevel is the fixed compression level of every layer. Changing it
// changes every layer digest.
const GzipLevel = gzip.BestSpeed

// Layer wraps the uncompressed tar at tarPath as a gzip-compressed
// v1.Layer: the gzip stream has no name and a zero mtime and is written at
// GzipLevel, so the same tar always gives the same digest. The tar is
// compressed once, when Layer is called (to compute the digest), and the
// compressed bytes are kept in memory for upload; tarPath must stay in place
// and unchanged while the layer is used (its diff ID is read from it). The
// media type is Docker's gzip layer; Append switches it to the OCI one on an
// OCI parent.
func Layer(tarPath string) (v1.Layer, error) {
	f, err := os.Open(tarPath)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", tarPath, err)
	}
	_ = f.Close()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(tarPath) },
		tarball.WithCompressionLevel(GzipLevel), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", tarPath, err)
	}
	return l, nil
}
