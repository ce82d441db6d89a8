package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/chunks"
	"github.com/levers9/levers9/volumes"
)

// fileChunk is the data of one put message: the server takes up to 1 MiB.
const fileChunk = 256 << 10

// stream runs fn with the session's token and no deadline: a transfer
// takes as long as the file needs, unlike the other calls' --timeout.
func (a *app) stream(fn func(ctx context.Context, conn *grpc.ClientConn) error) error {
	s, err := a.connect(true)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	return a.explain(s, fn(WithToken(ctx, s.ctx.Token), s.conn))
}

func (a *app) volumeLsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ls NAME [PATH]",
		Short: "List a directory of a volume (default its root), or show one file",
		Example: `  levers9 volume ls data
  levers9 volume ls data ckpt/ -o json`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := "/"
			if len(args) == 2 {
				p = args[1]
			}
			if _, err := volumes.CleanFilePath(p); err != nil {
				return err
			}
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListVolumeFilesResponse, error) {
				return v1.NewVolumeServiceClient(conn).ListVolumeFiles(ctx, &v1.ListVolumeFilesRequest{Name: args[0], Path: p})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			w := newTab(a)
			fmt.Fprintln(w, "PATH\tSIZE\tMODIFIED")
			for _, f := range resp.Files {
				name, size := f.Path, fmt.Sprint(f.Size)
				if f.Dir {
					name, size = name+"/", "-"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", name, size, when(f.ModifiedAt))
			}
			return w.Flush()
		},
	}
}

// putTarget is where put writes LOCAL: REMOTE, or LOCAL's base name in
// REMOTE when REMOTE ends in "/", or in the root when REMOTE is absent.
func putTarget(local, remote string) string {
	switch {
	case remote == "":
		return "/" + filepath.Base(local)
	case strings.HasSuffix(remote, "/"):
		return remote + filepath.Base(local)
	}
	return remote
}

func (a *app) volumePutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "put NAME LOCAL [REMOTE]",
		Short: "Upload a file into a volume (LOCAL - reads stdin; REMOTE defaults to LOCAL's name at the root)",
		Long: `Upload a file into a volume. The file appears under REMOTE only once all of it is
uploaded, replacing one there; an upload that fails leaves nothing. One that would take the
volume past its quota is refused.`,
		Example: `  levers9 volume put data ./model.bin
  levers9 volume put data ./model.bin ckpt/
  tar c src | levers9 volume put data - src.tar`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, local, remote := args[0], args[1], ""
			if len(args) == 3 {
				remote = args[2]
			}
			if local == "-" && remote == "" {
				return errors.New("put from stdin (-) needs REMOTE")
			}
			target, err := volumes.CleanFilePath(putTarget(local, remote))
			if err != nil {
				return err
			}
			if target == "/" {
				return errors.New("REMOTE is the volume's root: name a file")
			}
			var in io.Reader = a.io.In
			var size int64
			if local != "-" {
				f, err := os.Open(local)
				if err != nil {
					return fmt.Errorf("put: %w", err)
				}
				defer f.Close()
				st, err := f.Stat()
				if err != nil {
					return fmt.Errorf("put: %w", err)
				}
				if st.IsDir() {
					return fmt.Errorf("put: %s is a directory (put files one at a time, or a tar of it)", local)
				}
				in, size = f, st.Size()
			}
			var resp *v1.PutVolumeFileResponse
			err = a.stream(func(ctx context.Context, conn *grpc.ClientConn) error {
				st, err := v1.NewVolumeServiceClient(conn).PutVolumeFile(ctx)
				if err != nil {
					return err
				}
				// Ending the context on a read error aborts the upload, which
				// the server then removes.
				if err := chunks.Send(in, fileChunk, func(data []byte, first bool) error {
					m := &v1.PutVolumeFileRequest{Data: data}
					if first {
						m.Name, m.Path, m.Size = name, target, size
					}
					return st.Send(m)
				}); err != nil {
					return fmt.Errorf("put: reading %s: %w", local, err)
				}
				resp, err = st.CloseAndRecv()
				return err
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "%s:%s (%d bytes)\n", name, resp.File.GetPath(), resp.File.GetSize())
			return nil
		},
	}
}

func (a *app) volumeGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME REMOTE [LOCAL]",
		Short: "Download a file of a volume (LOCAL - writes stdout; default REMOTE's name here)",
		Example: `  levers9 volume get data ckpt/model.bin
  levers9 volume get data logs/run.txt - | less`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			remote, err := volumes.CleanFilePath(args[1])
			if err != nil {
				return err
			}
			if remote == "/" {
				return errors.New("REMOTE is the volume's root: name a file")
			}
			local := path.Base(remote)
			if len(args) == 3 {
				local = args[2]
			}
			if local != "-" {
				if st, err := os.Stat(local); err == nil && st.IsDir() {
					local = filepath.Join(local, path.Base(remote))
				}
			}
			return a.stream(func(ctx context.Context, conn *grpc.ClientConn) error {
				st, err := v1.NewVolumeServiceClient(conn).GetVolumeFile(ctx, &v1.GetVolumeFileRequest{Name: name, Path: remote})
				if err != nil {
					return err
				}
				if local == "-" {
					return recvFile(st, a.io.Out)
				}
				// A temporary file beside LOCAL, renamed once complete, so
				// a failed download leaves LOCAL as it was.
				tmp, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".l9get-*")
				if err != nil {
					return fmt.Errorf("get: %w", err)
				}
				defer os.Remove(tmp.Name())
				if err := recvFile(st, tmp); err != nil {
					tmp.Close()
					return err
				}
				if err := tmp.Close(); err != nil {
					return fmt.Errorf("get: writing %s: %w", local, err)
				}
				if err := os.Rename(tmp.Name(), local); err != nil {
					return fmt.Errorf("get: %w", err)
				}
				return nil
			})
		},
	}
}

// recvFile writes a GetVolumeFile stream to w until its end.
func recvFile(st grpc.ServerStreamingClient[v1.GetVolumeFileResponse], w io.Writer) error {
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := w.Write(m.GetData()); err != nil {
			return fmt.Errorf("get: writing: %w", err)
		}
	}
}

func (a *app) volumeRmCmd() *cobra.Command {
	var recursive bool
	rm := &cobra.Command{
		Use:   "rm NAME PATH [-r]",
		Short: "Remove a file of a volume, or a directory with -r",
		Example: `  levers9 volume rm data ckpt/old.bin
  levers9 volume rm data ckpt -r`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := volumes.CleanFilePath(args[1])
			if err != nil {
				return err
			}
			if p == "/" {
				return errors.New("PATH is the volume's root: delete the volume instead (levers9 volume delete)")
			}
			if _, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.DeleteVolumeFileResponse, error) {
				return v1.NewVolumeServiceClient(conn).DeleteVolumeFile(ctx, &v1.DeleteVolumeFileRequest{Name: args[0], Path: p, Recursive: recursive})
			}); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "removed %s:%s\n", args[0], p)
			return nil
		},
	}
	rm.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove a directory and everything in it")
	return rm
}
