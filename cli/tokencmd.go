package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

func (a *app) printJSON(m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: false}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(a.io.Out, string(b))
	return err
}

func when(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().Local().Format(time.DateTime)
}

// roleNames are the --role values, in the order help lists them.
var roleNames = []struct {
	name string
	role v1.Role
}{{"admin", v1.Role_ROLE_ADMIN}, {"member", v1.Role_ROLE_MEMBER}, {"machine-join", v1.Role_ROLE_MACHINE_JOIN}}

func parseRole(s string) (v1.Role, error) {
	var names []string
	for _, r := range roleNames {
		if r.name == s {
			return r.role, nil
		}
		names = append(names, r.name)
	}
	return 0, fmt.Errorf("--role %q: must be one of %s", s, strings.Join(names, ", "))
}

func roleName(r v1.Role) string {
	for _, n := range roleNames {
		if n.role == r {
			return n.name
		}
	}
	return "-"
}

func (a *app) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Manage API tokens of your workspace (admin tokens only)"}
	var name, role string
	create := &cobra.Command{
		Use:   "create [--name NAME] [--role admin|member|machine-join]",
		Short: "Create a token; its secret is printed once, so store it now",
		Long: `Create a token; its secret is printed once, so store it now.

Roles (--role, default member):
  admin         everything: tokens, machines, storage credentials, tasks, secrets
  member        run, follow, cancel and read tasks; put, list and delete secrets
                (values stay write-only); read the workspace and pools.
                No tokens, no machines.
  machine-join  only "levers9 machine create" (and whoami): for join scripts`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := parseRole(role)
			if err != nil {
				return err
			}
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.CreateTokenResponse, error) {
				return v1.NewTokenServiceClient(conn).CreateToken(ctx, &v1.CreateTokenRequest{Name: name, Role: r})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			fmt.Fprintf(a.io.Err, "token %s (%s, role %s) created. Its secret is shown this once:\n", resp.Token.Id, resp.Token.Name, roleName(resp.Token.Role))
			fmt.Fprintln(a.io.Out, resp.Secret)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "token", "a name to recognise the token by")
	create.Flags().StringVar(&role, "role", "member", "what the token may do: admin, member or machine-join")
	var all bool
	list := &cobra.Command{
		Use:   "list [--all]",
		Short: "List tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListTokensResponse, error) {
				return v1.NewTokenServiceClient(conn).ListTokens(ctx, &v1.ListTokensRequest{IncludeRevoked: all})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			w := newTab(a)
			fmt.Fprintln(w, "ID\tNAME\tROLE\tCREATED\tLAST USED\tREVOKED")
			for _, t := range resp.Tokens {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Id, t.Name, roleName(t.Role), when(t.CreatedAt), when(t.LastUsedAt), when(t.RevokedAt))
			}
			return w.Flush()
		},
	}
	list.Flags().BoolVar(&all, "all", false, "include revoked tokens")
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.RevokeTokenResponse, error) {
				return v1.NewTokenServiceClient(conn).RevokeToken(ctx, &v1.RevokeTokenRequest{Id: args[0]})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			fmt.Fprintf(a.io.Out, "token %s revoked\n", resp.Token.Id)
			return nil
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

func (a *app) whoamiCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show the workspace and token the current context uses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.AuthorizeResponse, error) {
				return v1.NewAuthServiceClient(conn).Authorize(ctx, &v1.AuthorizeRequest{})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			c, name, err := a.activeContext()
			if err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "context %s: workspace %s (%s), token %s, controlplane %s\n", name, resp.WorkspaceName, resp.WorkspaceId, resp.TokenId, c.Controlplane)
			return nil
		},
	}
}
