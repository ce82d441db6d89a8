package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// parseEnvLines reads KEY=VALUE lines; blank lines and # comments are
// skipped. Errors name the line, never its value.
func parseEnvLines(r io.Reader) (map[string]string, error) {
	vals := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("line %d: want KEY=VALUE", n)
		}
		vals[strings.TrimSpace(k)] = v
	}
	return vals, sc.Err()
}

func (a *app) secretCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "secret", Short: "Manage workspace secrets (sealed at rest, handed to tasks)"}
	var fromFile string
	put := &cobra.Command{
		Use:   "put NAME [--from-file FILE]",
		Short: "Create or replace a secret from KEY=VALUE lines on stdin or in a file",
		Long: `Create or replace a secret. Values are read as KEY=VALUE lines from --from-file or stdin,
never from the command line, so they stay out of shell history and process lists.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r io.Reader = a.in
			if fromFile != "" {
				f, err := os.Open(fromFile)
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			vals, err := parseEnvLines(r)
			if err != nil {
				return fmt.Errorf("read secret values: %w", err)
			}
			if len(vals) == 0 {
				return fmt.Errorf("no KEY=VALUE lines read (pipe them in, or use --from-file)")
			}
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.PutSecretResponse, error) {
				return v1.NewSecretServiceClient(conn).PutSecret(ctx, &v1.PutSecretRequest{Name: args[0], Values: vals})
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "secret %s saved with keys %s\n", resp.Secret.Name, strings.Join(resp.Secret.Keys, ", "))
			return nil
		},
	}
	put.Flags().StringVar(&fromFile, "from-file", "", "read KEY=VALUE lines from this file")
	list := &cobra.Command{
		Use:   "list",
		Short: "List secrets and their keys (never values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListSecretsResponse, error) {
				return v1.NewSecretServiceClient(conn).ListSecrets(ctx, &v1.ListSecretsRequest{})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			w := newTab(a)
			fmt.Fprintln(w, "NAME\tKEYS\tUPDATED")
			for _, sec := range resp.Secrets {
				fmt.Fprintf(w, "%s\t%s\t%s\n", sec.Name, strings.Join(sec.Keys, ","), when(sec.UpdatedAt))
			}
			return w.Flush()
		},
	}
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a secret",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.DeleteSecretResponse, error) {
				return v1.NewSecretServiceClient(conn).DeleteSecret(ctx, &v1.DeleteSecretRequest{Name: args[0]})
			}); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "secret %s deleted\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(put, list, del)
	return cmd
}
