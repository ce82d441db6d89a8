package sdk

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/chunks"
	"github.com/levers9/levers9/sandbox/image/recipe"
)

// MaxCopyBytes caps one copy step's source (its tar), as the
// controlplane's blob store does by default.
const MaxCopyBytes = 512 << 20

// blobChunk is the data of one PutBlob message.
const blobChunk = 1 << 20

// BuildImage starts the build of a recipe (or finds it built). Copy
// steps' sources (relative paths resolve against dir) are packed
// deterministically and uploaded once each; r itself is not changed. The
// build runs as a task: follow it with Follow(resp.Image.TaskId) unless
// resp.Cached, then ask Image for the result. progress, when not nil,
// hears about uploads.
func (c *Client) BuildImage(ctx context.Context, r *recipe.Recipe, dir string, force bool, progress func(string)) (*v1.BuildImageResponse, error) {
	r = r.Clone()
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("recipe: %w", err)
	}
	images := v1.NewImageServiceClient(c.conn)
	for i, st := range r.Steps {
		if st.Copy == nil {
			continue
		}
		src := st.Copy.Src
		if !filepath.IsAbs(src) {
			src = filepath.Join(dir, src)
		}
		digest, err := c.uploadSource(ctx, images, src, progress)
		if err != nil {
			return nil, fmt.Errorf("steps[%d]: copy %s: %w", i, st.Copy.Src, err)
		}
		r.Steps[i].Copy.Blob = digest
	}
	data, err := recipe.Marshal(r)
	if err != nil {
		return nil, err
	}
	var resp *v1.BuildImageResponse
	err = c.unary(ctx, "build image", func(ctx context.Context) (err error) {
		resp, err = images.BuildImage(ctx, &v1.BuildImageRequest{Recipe: data, Force: force})
		return err
	})
	return resp, err
}

// Image returns an image of the workspace by hash; a build that has ended
// is recorded first (READY or FAILED).
func (c *Client) Image(ctx context.Context, hash string) (*v1.Image, error) {
	var resp *v1.GetImageResponse
	err := c.unary(ctx, "get image "+hash, func(ctx context.Context) (err error) {
		resp, err = v1.NewImageServiceClient(c.conn).GetImage(ctx, &v1.GetImageRequest{Hash: hash})
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.Image, nil
}

// uploadSource packs src into a temporary tar and uploads it unless the
// workspace already has that content.
func (c *Client) uploadSource(ctx context.Context, images v1.ImageServiceClient, src string, progress func(string)) (string, error) {
	f, err := os.CreateTemp("", "levers9-copy-*.tar")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	digest, size, err := recipe.TarSource(ctx, src, f, MaxCopyBytes)
	if err != nil {
		return "", err
	}
	var stat *v1.StatBlobResponse
	if err := c.unary(ctx, "stat blob", func(ctx context.Context) (err error) {
		stat, err = images.StatBlob(ctx, &v1.StatBlobRequest{Digest: digest})
		return err
	}); err != nil {
		return "", err
	}
	if stat.GetExists() {
		return digest, nil
	}
	if progress != nil {
		progress(fmt.Sprintf("uploading %s (%d bytes)", src, size))
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	stream, err := images.PutBlob(c.authed(ctx))
	if err != nil {
		return "", c.apiErr("upload "+src, err)
	}
	if err := chunks.Send(f, blobChunk, func(data []byte, first bool) error {
		m := &v1.PutBlobRequest{Data: data}
		if first {
			m.Digest, m.Size = digest, size
		}
		return stream.Send(m)
	}); err != nil {
		return "", fmt.Errorf("read %s: %w", f.Name(), err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		return "", c.apiErr("upload "+src, err)
	}
	return digest, nil
}
