package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/volumes"
)

func (a *app) volumeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "volume", Short: "Manage workspace volumes (shared filesystems tasks mount with run --volume)"}
	var driver, quota string
	create := &cobra.Command{
		Use:   "create NAME [--driver seaweedfs|juicefs] [--quota SIZE]",
		Short: "Create a volume",
		Long: `Create a volume of the workspace. NAME is 1-63 lowercase letters, digits and '-'.
--quota caps what it holds (10G, 512Mi, bytes); a write past it fails with "no space left on device".`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := volumes.ValidateName(args[0]); err != nil {
				return err
			}
			var q int64
			if quota != "" {
				var err error
				if q, err = volumes.ParseSize(quota); err != nil {
					return fmt.Errorf("--quota: %w", err)
				}
			}
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.CreateVolumeResponse, error) {
				return v1.NewVolumeServiceClient(conn).CreateVolume(ctx, &v1.CreateVolumeRequest{Name: args[0], Driver: driver, QuotaBytes: q})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp.Volume)
			}
			fmt.Fprintf(a.io.Out, "volume %s created (driver %s, quota %s)\n", resp.Volume.Name, resp.Volume.Driver, quotaText(resp.Volume.QuotaBytes))
			return nil
		},
	}
	create.Flags().StringVar(&driver, "driver", "", "seaweedfs (default) or juicefs")
	create.Flags().StringVar(&quota, "quota", "", "cap on what the volume holds: 10G, 512Mi, or bytes (default none)")
	list := &cobra.Command{
		Use:   "list",
		Short: "List volumes with their sizes and file counts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListVolumesResponse, error) {
				return v1.NewVolumeServiceClient(conn).ListVolumes(ctx, &v1.ListVolumesRequest{})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			w := newTab(a)
			fmt.Fprintln(w, "NAME\tDRIVER\tSIZE\tFILES\tQUOTA\tUSED BY\tCREATED")
			for _, v := range resp.Volumes {
				size, files := statsText(v)
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d tasks\t%s\n", v.Name, v.Driver, size, files, quotaText(v.QuotaBytes), len(v.UsedBy), when(v.CreatedAt))
			}
			return w.Flush()
		},
	}
	show := &cobra.Command{
		Use:   "show NAME",
		Short: "Show a volume",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.GetVolumeResponse, error) {
				return v1.NewVolumeServiceClient(conn).GetVolume(ctx, &v1.GetVolumeRequest{Name: args[0]})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp.Volume)
			}
			v := resp.Volume
			size, files := statsText(v)
			w := newTab(a)
			fmt.Fprintf(w, "Name:\t%s\nID:\t%s\nDriver:\t%s\nSize:\t%s\nFiles:\t%s\nQuota:\t%s\nCreated:\t%s\n",
				v.Name, v.Id, v.Driver, size, files, quotaText(v.QuotaBytes), when(v.CreatedAt))
			if v.StatsError != "" {
				fmt.Fprintf(w, "Stats error:\t%s\n", v.StatsError)
			}
			used := "none"
			if len(v.UsedBy) > 0 {
				used = strings.Join(v.UsedBy, ", ")
			}
			fmt.Fprintf(w, "Used by:\t%s\n", used)
			return w.Flush()
		},
	}
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a volume and its data (refused while a task uses it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.DeleteVolumeResponse, error) {
				return v1.NewVolumeServiceClient(conn).DeleteVolume(ctx, &v1.DeleteVolumeRequest{Name: args[0]})
			}); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "volume %s deleted\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(create, list, show, del, a.volumeLsCmd(), a.volumePutCmd(), a.volumeGetCmd(), a.volumeRmCmd())
	return cmd
}

func quotaText(b int64) string {
	if b == 0 {
		return "none"
	}
	return volumes.FormatSize(b)
}

// statsText is the size and file count, or "?" when the filesystem could
// not be asked.
func statsText(v *v1.Volume) (string, string) {
	if v.Stats == nil {
		return "?", "?"
	}
	return volumes.FormatSize(int64(v.Stats.Bytes)), strconv.FormatUint(v.Stats.Files, 10)
}
