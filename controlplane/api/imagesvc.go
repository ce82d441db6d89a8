package api

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/images"
	"github.com/levers9/levers9/internal/errdefs"
)

// ImageService implements levers9.v1.ImageService over images.Service.
type ImageService struct {
	v1.UnimplementedImageServiceServer
	*Deps
}

func (s *ImageService) images(ctx context.Context) (*images.Service, string, error) {
	pr, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, "", err
	}
	if s.Images == nil {
		return nil, "", status.Error(codes.FailedPrecondition, "image builds are not available on this controlplane")
	}
	return s.Images, pr.WorkspaceID, nil
}

// BuildImage starts, joins or skips a build.
func (s *ImageService) BuildImage(ctx context.Context, req *v1.BuildImageRequest) (*v1.BuildImageResponse, error) {
	svc, ws, err := s.images(ctx)
	if err != nil {
		return nil, err
	}
	res, err := svc.Build(ctx, ws, req.GetRecipe(), req.GetForce())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.BuildImageResponse{Image: res.Image, Cached: res.Cached, Joined: res.Joined}, nil
}

// GetImage returns an image of the caller's workspace.
func (s *ImageService) GetImage(ctx context.Context, req *v1.GetImageRequest) (*v1.GetImageResponse, error) {
	svc, ws, err := s.images(ctx)
	if err != nil {
		return nil, err
	}
	img, err := svc.Get(ctx, ws, req.GetHash())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.GetImageResponse{Image: img}, nil
}

// ListImages lists the caller's workspace's images.
func (s *ImageService) ListImages(ctx context.Context, _ *v1.ListImagesRequest) (*v1.ListImagesResponse, error) {
	svc, ws, err := s.images(ctx)
	if err != nil {
		return nil, err
	}
	list, err := svc.List(ctx, ws)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.ListImagesResponse{Images: list}, nil
}

// DeleteImage forgets an image of the caller's workspace.
func (s *ImageService) DeleteImage(ctx context.Context, req *v1.DeleteImageRequest) (*v1.DeleteImageResponse, error) {
	svc, ws, err := s.images(ctx)
	if err != nil {
		return nil, err
	}
	if err := svc.Delete(ctx, ws, req.GetHash()); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.DeleteImageResponse{}, nil
}

// StatBlob says whether the caller's workspace uploaded a blob.
func (s *ImageService) StatBlob(ctx context.Context, req *v1.StatBlobRequest) (*v1.StatBlobResponse, error) {
	svc, ws, err := s.images(ctx)
	if err != nil {
		return nil, err
	}
	ok, size, err := svc.StatBlob(ctx, ws, req.GetDigest())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.StatBlobResponse{Exists: ok, Size: size}, nil
}

// PutBlob receives a blob.
func (s *ImageService) PutBlob(stream grpc.ClientStreamingServer[v1.PutBlobRequest, v1.PutBlobResponse]) error {
	ctx := stream.Context()
	svc, ws, err := s.images(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "put blob: no first message: %v", err)
	}
	if len(first.GetData()) > MaxFileChunk {
		return status.Errorf(codes.InvalidArgument, "put blob: messages carry at most %d bytes", MaxFileChunk)
	}
	r := &chunkReader[*v1.PutBlobRequest]{recv: stream.Recv, buf: first.GetData()}
	if err := svc.PutBlob(ctx, ws, first.GetDigest(), first.GetSize(), r); err != nil {
		return errdefs.ToGRPC(err)
	}
	return stream.SendAndClose(&v1.PutBlobResponse{Digest: first.GetDigest(), Size: first.GetSize()})
}
