package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"regexp"

	"github.com/google/go-containerregistry/pkg/name"
	gv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/internal/errdefs"
)

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// StatBlob reports whether the workspace uploaded a blob.
func (s *Service) StatBlob(ctx context.Context, wsID, digest string) (bool, int64, error) {
	if !digestRE.MatchString(digest) {
		return false, 0, fmt.Errorf("blob digest %q: want sha256:<64 hex>: %w", digest, errdefs.ErrInvalidArgument)
	}
	size, err := s.d.Store.ImageBlob(ctx, wsID, digest)
	if errdefs.IsNotFound(err) {
		return false, 0, nil
	}
	return err == nil, size, err
}

// PutBlob stores a blob the workspace uploads: its bytes (at most size,
// at most the limit) are spooled and hashed, and only a blob that hashes
// to digest goes to the registry's levers9/blobs.
func (s *Service) PutBlob(ctx context.Context, wsID, digest string, size int64, r io.Reader) error {
	if !digestRE.MatchString(digest) {
		return fmt.Errorf("blob digest %q: want sha256:<64 hex>: %w", digest, errdefs.ErrInvalidArgument)
	}
	if size < 0 || size > s.d.BlobLimit {
		return fmt.Errorf("blob %s: %d bytes is over the limit of %d: %w", digest, size, s.d.BlobLimit, errdefs.ErrInvalidArgument)
	}
	_, blobs := tasks.BuildRepositories(s.d.Config)
	if blobs == "" {
		return fmt.Errorf("put blob: worker.imageRegistry is not set: blobs are kept there: %w", errdefs.ErrFailedPrecondition)
	}
	repo, err := name.NewRepository(blobs)
	if err != nil {
		return fmt.Errorf("put blob: %w", err)
	}
	f, err := os.CreateTemp("", "levers9-blob-*")
	if err != nil {
		return fmt.Errorf("put blob %s: spool: %w", digest, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, size+1))
	if err != nil {
		return fmt.Errorf("put blob %s: receive: %w", digest, err)
	}
	if n != size {
		return fmt.Errorf("blob %s: received %d bytes, announced %d: %w", digest, n, size, errdefs.ErrInvalidArgument)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("blob %s: its bytes hash to %s: %w", digest, got, errdefs.ErrInvalidArgument)
	}
	l := &fileBlob{path: f.Name(), digest: digest, size: size}
	if err := remote.WriteLayer(repo, l, remote.WithContext(ctx), remote.WithAuth(s.auth(ctx, wsID, repo.RegistryStr()))); err != nil {
		return fmt.Errorf("put blob %s in %s: %w: %w", digest, blobs, errdefs.ErrUnavailable, err)
	}
	return s.d.Store.PutImageBlob(ctx, wsID, digest, size)
}

// fileBlob is a spooled blob as the registry client wants it: stored as
// it is (an uncompressed tar), so its digest is the digest of its bytes.
type fileBlob struct {
	path   string
	digest string
	size   int64
}

func (b *fileBlob) Digest() (gv1.Hash, error)            { return gv1.NewHash(b.digest) }
func (b *fileBlob) DiffID() (gv1.Hash, error)            { return gv1.NewHash(b.digest) }
func (b *fileBlob) Compressed() (io.ReadCloser, error)   { return os.Open(b.path) }
func (b *fileBlob) Uncompressed() (io.ReadCloser, error) { return os.Open(b.path) }
func (b *fileBlob) Size() (int64, error)                 { return b.size, nil }
func (b *fileBlob) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }
