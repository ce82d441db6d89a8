package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/clientconfig"
)

func (a *app) configCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Manage contexts: which controlplane to talk to, with which token",
	}
	cmd.AddCommand(a.configCreateCmd(), a.configUseCmd(), a.configListCmd(), a.configDeleteCmd())
	return cmd
}

// configCreateCmd is `config create`: a new context, its token asked for or bootstrapped.
func (a *app) configCreateCmd() *cobra.Command {
	var (
		cp, ca    string
		rest      string
		useTLS    bool
		makeCurr  bool
		workspace string
	)
	create := &cobra.Command{
		Use:   "create NAME --controlplane HOST:PORT [--rest HOST:PORT] [--tls] [--ca FILE]",
		Short: "Create a context and make it current if there is none",
		Long: `Create a context. The token is read from LEVERS9_TOKEN, or asked for (never from argv).
Leave the token empty while LEVERS9_BOOTSTRAP_SECRET is set to bootstrap a new controlplane:
the first workspace is created and its admin token saved in the context.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := Dir(a.getenv)
			if err != nil {
				return err
			}
			f, err := LoadFile(dir)
			if err == ErrNoConfig {
				f, err = &File{Contexts: map[string]Context{}}, nil
			}
			if err != nil {
				return err
			}
			name := args[0]
			if _, exists := f.Contexts[name]; exists {
				return fmt.Errorf("context %q exists: delete it first with `levers9 config delete %s`", name, name)
			}
			c := Context{Controlplane: cp, TLS: useTLS, CAFile: ca, REST: rest}
			if rest != "" {
				if _, err := clientconfig.RESTAddress(c, func(string) string { return "" }); err != nil {
					return fmt.Errorf("--rest: %w", err)
				}
			}
			if ca != "" {
				abs, err := filepath.Abs(ca)
				if err != nil {
					return err
				}
				c.CAFile = abs
			}
			if _, err := UseTLS(cp, useTLS, a.getenv); err != nil {
				return err
			}
			if c, err = a.obtainToken(c, name, workspace); err != nil {
				return err
			}
			f.Contexts[name] = c
			if f.Current == "" || makeCurr {
				f.Current = name
			}
			if err := f.Save(dir); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "context %q saved in %s", name, filepath.Join(dir, "config.toml"))
			if f.Current == name {
				fmt.Fprint(a.io.Out, " (current)")
			}
			fmt.Fprintln(a.io.Out)
			return nil
		},
	}
	create.Flags().StringVar(&cp, "controlplane", "", "controlplane gRPC address, HOST:PORT (required)")
	create.Flags().StringVar(&rest, "rest", "", "REST gateway address, HOST:PORT, for REST clients such as the Python SDK (default: the controlplane's host on port 1994)")
	create.Flags().BoolVar(&useTLS, "tls", false, "use TLS on a port other than 443")
	create.Flags().StringVar(&ca, "ca", "", "PEM file of a CA to trust (for a private or self-signed certificate)")
	create.Flags().BoolVar(&makeCurr, "use", false, "make the new context current")
	create.Flags().StringVar(&workspace, "workspace", "", "name of the workspace a bootstrap creates (default \"default\")")
	_ = create.MarkFlagRequired("controlplane")
	return create
}

// configUseCmd is `config use`: make a context current.
func (a *app) configUseCmd() *cobra.Command {
	use := &cobra.Command{
		Use:   "use NAME",
		Short: "Make a context current",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.editContext(args[0], func(f *File) { f.Current = args[0] }); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "now using context %q\n", args[0])
			return nil
		},
	}
	return use
}

// configListCmd is `config list`: the contexts, never their tokens.
func (a *app) configListCmd() *cobra.Command {
	list := &cobra.Command{
		Use:   "list",
		Short: "List contexts (tokens are never shown)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, f, err := a.loadExisting()
			if err != nil {
				return err
			}
			type row struct {
				Name         string `json:"name"`
				Controlplane string `json:"controlplane"`
				REST         string `json:"rest"`
				TLS          bool   `json:"tls"`
				HasToken     bool   `json:"hasToken"`
				Current      bool   `json:"current"`
			}
			var rows []row
			for _, n := range f.Names() {
				c := f.Contexts[n]
				t, _ := UseTLS(c.Controlplane, c.TLS, a.getenv)
				rest, _ := clientconfig.RESTAddress(c, func(string) string { return "" })
				rows = append(rows, row{n, c.Controlplane, rest, t, c.Token != "", n == f.Current})
			}
			if a.output == "json" {
				return json.NewEncoder(a.io.Out).Encode(rows)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CURRENT\tNAME\tCONTROLPLANE\tREST\tTLS\tTOKEN")
			for _, r := range rows {
				cur, tok := "", "none"
				if r.Current {
					cur = "*"
				}
				if r.HasToken {
					tok = "set"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%s\n", cur, r.Name, r.Controlplane, r.REST, r.TLS, tok)
			}
			return w.Flush()
		},
	}
	return list
}

// configDeleteCmd is `config delete`: forget a context (its token stays valid).
func (a *app) configDeleteCmd() *cobra.Command {
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a context (the token stays valid on the controlplane; revoke it there)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.editContext(args[0], func(f *File) {
				delete(f.Contexts, args[0])
				if f.Current == args[0] {
					f.Current = ""
				}
			}); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "context %q deleted\n", args[0])
			return nil
		},
	}
	return del
}

func (a *app) loadExisting() (string, *File, error) {
	dir, err := Dir(a.getenv)
	if err != nil {
		return "", nil, err
	}
	f, err := LoadFile(dir)
	if err == ErrNoConfig {
		return "", nil, fmt.Errorf("no contexts yet: create one with `levers9 config create NAME --controlplane HOST:PORT`")
	}
	return dir, f, err
}

// editContext loads the config, checks that context name exists, applies
// edit and saves the file.
func (a *app) editContext(name string, edit func(f *File)) error {
	dir, f, err := a.loadExisting()
	if err != nil {
		return err
	}
	if _, ok := f.Contexts[name]; !ok {
		return fmt.Errorf("no context %q: see `levers9 config list`", name)
	}
	edit(f)
	return f.Save(dir)
}

// obtainToken fills c.Token from LEVERS9_TOKEN or a prompt; an empty answer
// with LEVERS9_BOOTSTRAP_SECRET set bootstraps.
func (a *app) obtainToken(c Context, name, workspace string) (Context, error) {
	if t := a.getenv("LEVERS9_TOKEN"); t != "" {
		c.Token = t
		return c, nil
	}
	hint := "Token (empty to save the context without one): "
	secret := a.getenv("LEVERS9_BOOTSTRAP_SECRET")
	if secret != "" {
		hint = "Token (empty to bootstrap the first workspace with LEVERS9_BOOTSTRAP_SECRET): "
	}
	tok, err := a.promptSecret(hint)
	if err != nil {
		return c, err
	}
	if tok != "" {
		c.Token = tok
		return c, nil
	}
	if secret == "" {
		fmt.Fprintf(a.io.Err, "context %q has no token: set LEVERS9_TOKEN when using it\n", name)
		return c, nil
	}
	s := &session{ctx: c, name: name}
	if s.tls, err = UseTLS(c.Controlplane, c.TLS, a.getenv); err != nil {
		return c, err
	}
	if s.conn, err = Dial(c, a.getenv); err != nil {
		return c, err
	}
	defer s.Close()
	var resp *v1.AuthorizeResponse
	err = a.call(s, func(ctx context.Context) error {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-levers9-bootstrap-secret", secret)
		var err error
		resp, err = v1.NewAuthServiceClient(s.conn).Authorize(ctx, &v1.AuthorizeRequest{WorkspaceName: workspace})
		return err
	})
	if err != nil {
		return c, fmt.Errorf("bootstrap: %w", err)
	}
	c.Token = resp.Token
	fmt.Fprintf(a.io.Err, "bootstrapped workspace %q (%s); its admin token is saved in context %q\n", resp.WorkspaceName, resp.WorkspaceId, name)
	return c, nil
}

// firstRun asks for a controlplane and a token when there is no config.
func (a *app) firstRun(dir string) (Context, string, error) {
	fmt.Fprintf(a.io.Err, "No levers9 CLI config yet (%s). Let's make one.\n", filepath.Join(dir, "config.toml"))
	cp, err := a.prompt("Controlplane address (HOST:PORT): ")
	if err != nil {
		return Context{}, "", err
	}
	useTLS, err := UseTLS(cp, false, a.getenv)
	if err != nil {
		return Context{}, "", err
	}
	c := Context{Controlplane: cp, TLS: useTLS, CAFile: a.getenv("LEVERS9_CONTROLPLANE_CA")}
	if c, err = a.obtainToken(c, "default", ""); err != nil {
		return Context{}, "", err
	}
	f := &File{Current: "default", Contexts: map[string]Context{"default": c}}
	if err := f.Save(dir); err != nil {
		return Context{}, "", err
	}
	fmt.Fprintf(a.io.Err, "saved context \"default\" in %s\n", filepath.Join(dir, "config.toml"))
	return c, "default", nil
}

func newTab(a *app) *tabwriter.Writer { return tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0) }
