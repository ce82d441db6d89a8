package api

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/volumes"
)

// MaxFileChunk bounds the data of one PutVolumeFile or GetVolumeFile
// message, well under gRPC's 4 MiB default message limit.
const MaxFileChunk = 1 << 20

// volumeFiles finds the caller's workspace's volume and its driver's file
// access, and cleans p.
func (s *VolumeService) volumeFiles(ctx context.Context, name, p string) (volumes.Volume, volumes.Files, string, error) {
	pr, err := auth.MustPrincipal(ctx)
	if err != nil {
		return volumes.Volume{}, nil, "", err
	}
	clean, err := volumes.CleanFilePath(p)
	if err != nil {
		return volumes.Volume{}, nil, "", err
	}
	row, err := s.Store.GetVolume(ctx, pr.WorkspaceID, name)
	if err != nil {
		return volumes.Volume{}, nil, "", err
	}
	d, err := s.driver(row.Driver)
	if err != nil {
		return volumes.Volume{}, nil, "", err
	}
	f, ok := d.(volumes.Files)
	if !ok {
		return volumes.Volume{}, nil, "", fmt.Errorf("volume %s: driver %s cannot read or write files from here: %w", name, row.Driver, errdefs.ErrFailedPrecondition)
	}
	return driverVolume(row), f, clean, nil
}

func filePB(f volumes.FileInfo) *v1.VolumeFile {
	out := &v1.VolumeFile{Path: f.Path, Dir: f.Dir, Size: f.Size}
	if !f.ModTime.IsZero() {
		out.ModifiedAt = timestamppb.New(f.ModTime)
	}
	return out
}

// fileErr is err for the client, with the volume's name rather than its id
// where the driver's message has the id.
func fileErr(v volumes.Volume, err error) error {
	if errors.Is(err, volumes.ErrFull) {
		return status.Errorf(codes.ResourceExhausted, "volume %s is full (quota %s)", v.Name, volumes.FormatSize(v.QuotaBytes))
	}
	return errdefs.ToGRPC(err)
}

// ListVolumeFiles lists a directory of a volume, or gives a file's entry.
func (s *VolumeService) ListVolumeFiles(ctx context.Context, req *v1.ListVolumeFilesRequest) (*v1.ListVolumeFilesResponse, error) {
	v, f, p, err := s.volumeFiles(ctx, req.GetName(), req.GetPath())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	list, err := f.ListFiles(ctx, v, p)
	if err != nil {
		return nil, fileErr(v, fmt.Errorf("volume %s: %w", v.Name, err))
	}
	resp := &v1.ListVolumeFilesResponse{}
	for _, e := range list {
		resp.Files = append(resp.Files, filePB(e))
	}
	return resp, nil
}

// chunkReader reads the data of a client stream's messages as one byte
// stream, starting with the first message's, which the handler has already
// read (PutVolumeFile, PutBlob). A message of more than MaxFileChunk bytes
// is InvalidArgument; io.EOF is the client's CloseSend.
type chunkReader[M interface{ GetData() []byte }] struct {
	recv func() (M, error)
	buf  []byte
}

func (r *chunkReader[M]) Read(b []byte) (int, error) {
	for len(r.buf) == 0 {
		m, err := r.recv()
		if err != nil {
			return 0, err
		}
		if len(m.GetData()) > MaxFileChunk {
			return 0, fmt.Errorf("a chunk of %d bytes: at most %d: %w", len(m.GetData()), MaxFileChunk, errdefs.ErrInvalidArgument)
		}
		r.buf = m.GetData()
	}
	n := copy(b, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// PutVolumeFile writes a file of a volume from the stream.
func (s *VolumeService) PutVolumeFile(stream grpc.ClientStreamingServer[v1.PutVolumeFileRequest, v1.PutVolumeFileResponse]) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return errdefs.ToGRPC(fmt.Errorf("reading the first message of a file upload: %w", err))
	}
	if len(first.GetData()) > MaxFileChunk {
		return errdefs.ToGRPC(fmt.Errorf("a chunk of %d bytes: at most %d: %w", len(first.GetData()), MaxFileChunk, errdefs.ErrInvalidArgument))
	}
	v, f, p, err := s.volumeFiles(ctx, first.GetName(), first.GetPath())
	if err != nil {
		return errdefs.ToGRPC(err)
	}
	if p == "/" {
		return errdefs.ToGRPC(fmt.Errorf("volume %s: cannot write a file at its root directory: %w", v.Name, errdefs.ErrInvalidArgument))
	}
	// A declared size past the quota is refused before the client sends
	// it all; the driver still counts what arrives.
	if v.QuotaBytes > 0 && first.GetSize() > v.QuotaBytes {
		return fileErr(v, volumes.ErrFull)
	}
	info, err := f.PutFile(ctx, v, p, &chunkReader[*v1.PutVolumeFileRequest]{recv: stream.Recv, buf: first.GetData()})
	if err != nil {
		return fileErr(v, fmt.Errorf("volume %s: %w", v.Name, err))
	}
	return stream.SendAndClose(&v1.PutVolumeFileResponse{File: filePB(info)})
}

// GetVolumeFile streams a file of a volume.
func (s *VolumeService) GetVolumeFile(req *v1.GetVolumeFileRequest, stream grpc.ServerStreamingServer[v1.GetVolumeFileResponse]) error {
	ctx := stream.Context()
	v, f, p, err := s.volumeFiles(ctx, req.GetName(), req.GetPath())
	if err != nil {
		return errdefs.ToGRPC(err)
	}
	rc, err := f.OpenFile(ctx, v, p)
	if err != nil {
		return fileErr(v, fmt.Errorf("volume %s: %w", v.Name, err))
	}
	defer rc.Close()
	buf := make([]byte, MaxFileChunk)
	for {
		n, err := io.ReadFull(rc, buf)
		if n > 0 {
			if serr := stream.Send(&v1.GetVolumeFileResponse{Data: buf[:n]}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return errdefs.ToGRPC(fmt.Errorf("volume %s: reading %s: %w", v.Name, p, err))
		}
	}
}

// DeleteVolumeFile removes a file, or a directory tree with recursive.
func (s *VolumeService) DeleteVolumeFile(ctx context.Context, req *v1.DeleteVolumeFileRequest) (*v1.DeleteVolumeFileResponse, error) {
	v, f, p, err := s.volumeFiles(ctx, req.GetName(), req.GetPath())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if err := f.RemoveFile(ctx, v, p, req.GetRecursive()); err != nil {
		return nil, fileErr(v, fmt.Errorf("volume %s: %w", v.Name, err))
	}
	return &v1.DeleteVolumeFileResponse{}, nil
}
