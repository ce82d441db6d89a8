package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

func (a *app) registryCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "registry", Short: "Log the workspace in to private image registries"}
	var username string
	login := &cobra.Command{
		Use:   "login HOST --username USER",
		Short: "Store the workspace's login to a registry; the password or token is read from stdin",
		Long: `Store the workspace's login to an image registry (HOST or HOST:PORT, as image references
name it), sealed at rest. The password or access token is read from stdin (without echo on a
terminal), never from the command line, so it stays out of shell history and process lists:

  printf '%s\n' "$REGISTRY_TOKEN" | levers9 registry login registry.example.com --username ci

The controlplane hands the login to the agent with each task whose image is in that registry,
for that pull only. Logging in again to the same HOST replaces the login.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if username == "" {
				return fmt.Errorf("--username is required")
			}
			password, err := a.promptSecret("Password or token for " + args[0] + ": ")
			if err != nil {
				return fmt.Errorf("read the password from stdin: %w", err)
			}
			if password == "" {
				return fmt.Errorf("no password or token read from stdin")
			}
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.LoginRegistryResponse, error) {
				return v1.NewRegistryServiceClient(conn).LoginRegistry(ctx, &v1.LoginRegistryRequest{Host: args[0], Username: username, Password: password})
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "logged in to registry %s as %s\n", resp.Credential.Host, resp.Credential.Username)
			return nil
		},
	}
	login.Flags().StringVarP(&username, "username", "u", "", "the registry username")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the workspace's registry logins: hosts and usernames, never passwords",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListRegistryCredentialsResponse, error) {
				return v1.NewRegistryServiceClient(conn).ListRegistryCredentials(ctx, &v1.ListRegistryCredentialsRequest{})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			w := newTab(a)
			fmt.Fprintln(w, "HOST\tUSERNAME\tUPDATED")
			for _, c := range resp.Credentials {
				fmt.Fprintf(w, "%s\t%s\t%s\n", c.Host, c.Username, when(c.UpdatedAt))
			}
			return w.Flush()
		},
	}
	logout := &cobra.Command{
		Use:   "logout HOST",
		Short: "Forget the workspace's login to a registry",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.LogoutRegistryResponse, error) {
				return v1.NewRegistryServiceClient(conn).LogoutRegistry(ctx, &v1.LogoutRegistryRequest{Host: args[0]})
			}); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "logged out of registry %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(login, list, logout)
	return cmd
}
