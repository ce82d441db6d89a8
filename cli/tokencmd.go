package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
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

func (a *app) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Manage API tokens of your workspace"}
	var name string
	create := &cobra.Command{
		Use:   "create [--name NAME]",
		Short: "Create a token; its secret is printed once, so store it now",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.connect(true)
			if err != nil {
				return err
			}
			defer s.Close()
			var resp *v1.CreateTokenResponse
			err = a.call(s, func(ctx context.Context) error {
				resp, err = v1.NewTokenServiceClient(s.conn).CreateToken(ctx, &v1.CreateTokenRequest{Name: name})
				return err
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			fmt.Fprintf(a.io.Err, "token %s (%s) created. Its secret is shown this once:\n", resp.Token.Id, resp.Token.Name)
			fmt.Fprintln(a.io.Out, resp.Secret)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "token", "a name to recognise the token by")
	var all bool
	list := &cobra.Command{
		Use:   "list [--all]",
		Short: "List tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.connect(true)
			if err != nil {
				return err
			}
			defer s.Close()
			var resp *v1.ListTokensResponse
			err = a.call(s, func(ctx context.Context) error {
				resp, err = v1.NewTokenServiceClient(s.conn).ListTokens(ctx, &v1.ListTokensRequest{IncludeRevoked: all})
				return err
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			w := newTab(a)
			fmt.Fprintln(w, "ID\tNAME\tCREATED\tLAST USED\tREVOKED")
			for _, t := range resp.Tokens {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", t.Id, t.Name, when(t.CreatedAt), when(t.LastUsedAt), when(t.RevokedAt))
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
			s, err := a.connect(true)
			if err != nil {
				return err
			}
			defer s.Close()
			var resp *v1.RevokeTokenResponse
			err = a.call(s, func(ctx context.Context) error {
				resp, err = v1.NewTokenServiceClient(s.conn).RevokeToken(ctx, &v1.RevokeTokenRequest{Id: args[0]})
				return err
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
			s, err := a.connect(true)
			if err != nil {
				return err
			}
			defer s.Close()
			var resp *v1.AuthorizeResponse
			err = a.call(s, func(ctx context.Context) error {
				resp, err = v1.NewAuthServiceClient(s.conn).Authorize(ctx, &v1.AuthorizeRequest{})
				return err
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			fmt.Fprintf(a.io.Out, "context %s: workspace %s (%s), token %s, controlplane %s\n", s.name, resp.WorkspaceName, resp.WorkspaceId, resp.TokenId, s.ctx.Controlplane)
			return nil
		},
	}
}
