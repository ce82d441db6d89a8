package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sandbox/image/recipe"
	"github.com/levers9/levers9/volumes"
)

func (a *app) imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build images from recipes and manage the workspace's built images"}
	var file string
	var force bool
	build := &cobra.Command{
		Use:   "build -f image.yaml",
		Short: "Build an image from a recipe and print its reference",
		Long: `Build an image from a recipe on your machines (the build pool, or default), without a
Docker engine, and print the reference tasks run it by. A recipe is YAML:

  base: debian:bookworm-slim        # default levers9-runner:latest; a name without a registry comes from imageService.runner.baseImageRegistry
  steps:
    - apt: [python3]                # rendered into a run step (needs a package mirror)
    - env: {APP_MODE: prod}
    - workdir: /app
    - copy: {src: ./src, dst: /app} # a local file or directory (relative to the recipe), placed under dst
    - run: python3 -m compileall /app
  user: "1000"
  entrypoint: [python3, -m, app]

The image is identified by the recipe's content (its base by digest, its steps, the content
of copied files): building the same recipe again returns at once, and a changed step rebuilds
from that step on. Output streams as the build runs; Ctrl-C cancels the build.`,
		Example: `  levers9 image build -f image.yaml
  levers9 run --image-file image.yaml -- python3 -m app`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			img, err := a.buildImage(file, force, a.io.Out)
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(img)
			}
			fmt.Fprintln(a.io.Out, img.Ref)
			return nil
		},
	}
	build.Flags().StringVarP(&file, "file", "f", "", "the recipe (YAML or JSON); - reads standard input")
	build.Flags().BoolVar(&force, "force", false, "build again even when the workspace has the image")
	_ = build.MarkFlagRequired("file")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the workspace's images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListImagesResponse, error) {
				return v1.NewImageServiceClient(conn).ListImages(ctx, &v1.ListImagesRequest{})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			w := newTab(a)
			fmt.Fprintln(w, "HASH\tSTATE\tBASE\tSTEPS\tSIZE\tBUILT")
			for _, img := range resp.Images {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", shortHash(img.Hash), imageState(img.State), img.Base, img.Steps,
					volumes.FormatSize(img.SizeBytes), when(img.BuiltAt))
			}
			return w.Flush()
		},
	}
	show := &cobra.Command{
		Use:   "show HASH",
		Short: "Show an image: its reference, state, build task and recipe",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			hash, err := a.fullHash(args[0])
			if err != nil {
				return err
			}
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.GetImageResponse, error) {
				return v1.NewImageServiceClient(conn).GetImage(ctx, &v1.GetImageRequest{Hash: hash})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp.Image)
			}
			img := resp.Image
			w := newTab(a)
			fmt.Fprintf(w, "Hash:\t%s\nState:\t%s\nReference:\t%s\nBase:\t%s\nSteps:\t%d (%d reused from earlier builds)\nSize:\t%s\nBuild task:\t%s\nCreated:\t%s\nBuilt:\t%s\n",
				img.Hash, imageState(img.State), img.Ref, img.Base, img.Steps, img.CachedSteps, volumes.FormatSize(img.SizeBytes),
				img.TaskId, when(img.CreatedAt), when(img.BuiltAt))
			if img.Error != "" {
				fmt.Fprintf(w, "Error:\t%s\n", img.Error)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "Recipe:\n  %s\n", img.Recipe)
			return nil
		},
	}
	del := &cobra.Command{
		Use:   "delete HASH",
		Short: "Forget an image and its cached steps (the next build of its recipe starts over)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			hash, err := a.fullHash(args[0])
			if err != nil {
				return err
			}
			if _, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.DeleteImageResponse, error) {
				return v1.NewImageServiceClient(conn).DeleteImage(ctx, &v1.DeleteImageRequest{Hash: hash})
			}); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "image %s deleted\n", shortHash(hash))
			return nil
		},
	}
	cmd.AddCommand(build, list, show, del)
	return cmd
}

// buildImage builds the recipe in file, following the build's output to
// its end (build output to logs), and returns the READY image.
func (a *app) buildImage(file string, force bool, logs io.Writer) (*v1.Image, error) {
	var data []byte
	var err error
	dir := "."
	if file == "-" {
		data, err = io.ReadAll(io.LimitReader(a.io.In, recipe.MaxRecipeBytes+1))
	} else {
		data, err = os.ReadFile(file)
		dir = filepath.Dir(file)
	}
	if err != nil {
		return nil, fmt.Errorf("read recipe: %w", err)
	}
	r, err := recipe.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	s, c, err := a.taskClient()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	ctx := context.Background()
	resp, err := c.BuildImage(ctx, r, dir, force, func(msg string) { fmt.Fprintf(a.io.Err, "levers9: %s\n", msg) })
	if err != nil {
		return nil, a.explain(s, err)
	}
	img := resp.Image
	switch {
	case resp.Cached:
		fmt.Fprintf(a.io.Err, "levers9: image %s is built (cached)\n", shortHash(img.Hash))
		return img, nil
	case resp.Joined:
		fmt.Fprintf(a.io.Err, "levers9: following the build already running (task %s)\n", img.TaskId)
	default:
		fmt.Fprintf(a.io.Err, "levers9: building image %s in task %s (%d of %d steps cached)\n", shortHash(img.Hash), img.TaskId,
			img.CachedSteps, img.Steps)
	}
	sigs, stop := a.notify()
	defer stop()
	err = a.followToEnd(s, c, img.TaskId, logs, sigs, true, false)
	final, gerr := c.Image(ctx, img.Hash)
	if gerr != nil {
		return nil, a.explain(s, gerr)
	}
	if final.State != v1.ImageState_IMAGE_STATE_READY {
		if err == nil {
			err = fmt.Errorf("image %s: %s", shortHash(img.Hash), final.Error)
		}
		return nil, err
	}
	return final, nil
}

// fullHash accepts a hash as printed (its first 12 hex digits) or whole.
func (a *app) fullHash(h string) (string, error) {
	h = strings.TrimPrefix(h, "sha256:")
	if len(h) == 64 {
		return "sha256:" + h, nil
	}
	resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListImagesResponse, error) {
		return v1.NewImageServiceClient(conn).ListImages(ctx, &v1.ListImagesRequest{})
	})
	if err != nil {
		return "", err
	}
	var found []string
	for _, img := range resp.Images {
		if h != "" && strings.HasPrefix(strings.TrimPrefix(img.Hash, "sha256:"), h) {
			found = append(found, img.Hash)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return "", fmt.Errorf("no image of this workspace has a hash starting with %q (levers9 image list)", h)
	}
	return "", fmt.Errorf("%q matches %d images: give more of the hash", h, len(found))
}

func shortHash(h string) string {
	h = strings.TrimPrefix(h, "sha256:")
	return h[:min(12, len(h))]
}

func imageState(s v1.ImageState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "IMAGE_STATE_"))
}
