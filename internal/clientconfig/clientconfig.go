// Package clientconfig owns how a levers9 client finds its controlplane: the
// contexts file ~/.levers9/config.toml (mode 0600, LEVERS9_HOME moves the
// directory), the environment that overrides it (LEVERS9_CONTROLPLANE,
// LEVERS9_TOKEN, LEVERS9_CONTEXT, LEVERS9_CONTROLPLANE_TLS,
// LEVERS9_CONTROLPLANE_CA), the TLS rule (port 443 always, other ports only
// when asked), dialing, and turning transport errors into advice. The CLI
// and the SDK share it so both follow the same rules. It never prompts,
// never prints, and never puts a token in an error. Internal: its API
// changes with its two callers.
package clientconfig

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/levers9/levers9/internal/secretfile"
)

// Context is one named controlplane a client can talk to.
type Context struct {
	Controlplane string `toml:"controlplane"`
	Token        string `toml:"token,omitempty"`
	TLS          bool   `toml:"tls,omitempty"`
	// CAFile trusts a private CA (a dev stack's self-signed certificate).
	CAFile string `toml:"ca_file,omitempty"`
	// REST is the REST gateway's HOST:PORT, for clients that speak REST
	// (the Python SDK); empty means the controlplane's host on port 1994.
	REST string `toml:"rest,omitempty"`
}

// File is ~/.levers9/config.toml.
type File struct {
	Current  string             `toml:"current"`
	Contexts map[string]Context `toml:"contexts"`
}

// ErrNoConfig means there is no config file yet.
var ErrNoConfig = errors.New("no levers9 CLI config")

// EnvironmentContext is the name Resolve gives a context made from
// LEVERS9_CONTROLPLANE.
const EnvironmentContext = "(environment)"

// Dir is the client's state directory: $LEVERS9_HOME, else ~/.levers9.
func Dir(getenv func(string) string) (string, error) {
	if d := getenv("LEVERS9_HOME"); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find your home directory (or set LEVERS9_HOME): %w", err)
	}
	return filepath.Join(home, ".levers9"), nil
}

// LoadFile reads the config; a missing file is ErrNoConfig.
func LoadFile(dir string) (*File, error) {
	path := filepath.Join(dir, "config.toml")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoConfig
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var f File
	if err := toml.NewDecoder(bytes.NewReader(b)).DisallowUnknownFields().Decode(&f); err != nil {
		return nil, fmt.Errorf("%s does not parse (fix or delete it): %w", path, err)
	}
	if f.Contexts == nil {
		f.Contexts = map[string]Context{}
	}
	return &f, nil
}

// Save writes the config atomically with mode 0600 (it holds tokens), in a
// 0700 directory.
func (f *File) Save(dir string) error {
	b, err := toml.Marshal(f)
	if err != nil {
		return err
	}
	if err := secretfile.Write(filepath.Join(dir, "config.toml"), b); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return nil
}

// Names lists the contexts in order.
func (f *File) Names() []string {
	names := make([]string, 0, len(f.Contexts))
	for n := range f.Contexts {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Resolve picks the active context: LEVERS9_CONTROLPLANE (with
// LEVERS9_CONTROLPLANE_CA) skips the file; otherwise the context named by
// name, else LEVERS9_CONTEXT, else the file's current one. LEVERS9_TOKEN
// overrides the token either way. A missing file is ErrNoConfig (the CLI
// then asks; the SDK says how to make one).
func Resolve(getenv func(string) string, name string) (Context, string, error) {
	c, name, err := resolve(getenv, name)
	if err != nil {
		return Context{}, "", err
	}
	if t := getenv("LEVERS9_TOKEN"); t != "" {
		c.Token = t
	}
	return c, name, nil
}

func resolve(getenv func(string) string, name string) (Context, string, error) {
	if cp := getenv("LEVERS9_CONTROLPLANE"); cp != "" {
		return Context{Controlplane: cp, CAFile: getenv("LEVERS9_CONTROLPLANE_CA")}, EnvironmentContext, nil
	}
	dir, err := Dir(getenv)
	if err != nil {
		return Context{}, "", err
	}
	f, err := LoadFile(dir)
	if err != nil {
		return Context{}, "", err
	}
	if name == "" {
		name = getenv("LEVERS9_CONTEXT")
	}
	if name == "" {
		name = f.Current
	}
	if name == "" {
		return Context{}, "", fmt.Errorf("no current context: pick one with `levers9 config use NAME` (have: %s)", strings.Join(f.Names(), ", "))
	}
	c, ok := f.Contexts[name]
	if !ok {
		return Context{}, "", fmt.Errorf("no context %q: see `levers9 config list`", name)
	}
	return c, name, nil
}

// DefaultRESTPort is the REST gateway's port when a context names none.
const DefaultRESTPort = "1994"

// RESTAddress is the context's REST gateway: LEVERS9_REST, else the
// context's rest, else the controlplane's host on DefaultRESTPort. The TLS
// rule is the controlplane's (UseTLS with the context's tls).
func RESTAddress(c Context, getenv func(string) string) (string, error) {
	if v := getenv("LEVERS9_REST"); v != "" {
		return v, checkHostPort("LEVERS9_REST", v)
	}
	if c.REST != "" {
		return c.REST, checkHostPort("rest", c.REST)
	}
	host, _, err := net.SplitHostPort(c.Controlplane)
	if err != nil {
		return "", fmt.Errorf("controlplane %q is not HOST:PORT: %w", c.Controlplane, err)
	}
	return net.JoinHostPort(host, DefaultRESTPort), nil
}

// checkHostPort refuses an address that is not HOST:PORT with a numeric
// port, naming where it came from.
func checkHostPort(what, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q is not HOST:PORT: %w", what, addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
		return fmt.Errorf("%s %q is not HOST:PORT with a port in 1..65535", what, addr)
	}
	return nil
}

// UseTLS decides TLS for an address: port 443 always; other ports only when
// the context says tls = true or LEVERS9_CONTROLPLANE_TLS=true.
func UseTLS(addr string, ctxTLS bool, getenv func(string) string) (bool, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("controlplane %q is not HOST:PORT: %w", addr, err)
	}
	if port == "443" || ctxTLS {
		return true, nil
	}
	if v := getenv("LEVERS9_CONTROLPLANE_TLS"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("LEVERS9_CONTROLPLANE_TLS=%q is not true or false", v)
		}
		return b, nil
	}
	return false, nil
}

// Dial connects to the context's controlplane (lazily, as grpc.NewClient
// does).
func Dial(c Context, getenv func(string) string) (*grpc.ClientConn, error) {
	useTLS, err := UseTLS(c.Controlplane, c.TLS, getenv)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if useTLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		caFile := c.CAFile
		if v := getenv("LEVERS9_CONTROLPLANE_CA"); v != "" {
			caFile = v
		}
		if caFile != "" {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return nil, fmt.Errorf("read CA file %s: %w", caFile, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
			}
			cfg.RootCAs = pool
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(c.Controlplane, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", c.Controlplane, err)
	}
	return conn, nil
}

// WithToken adds the bearer token to outgoing calls.
func WithToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// ExplainTransport turns the opaque errors of a TLS/plaintext mismatch or
// an unreachable controlplane into advice, keeping err wrapped.
func ExplainTransport(err error, c Context, useTLS bool) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return fmt.Errorf("%s does not speak TLS: create the context without --tls (or unset LEVERS9_CONTROLPLANE_TLS): %w", c.Controlplane, err)
	case !useTLS && (strings.Contains(msg, "error reading server preface") || strings.Contains(msg, "EOF")):
		return fmt.Errorf("%s closed the connection: it probably wants TLS, so recreate the context with --tls or set LEVERS9_CONTROLPLANE_TLS=true: %w", c.Controlplane, err)
	case strings.Contains(msg, "certificate signed by unknown authority"):
		return fmt.Errorf("%s has a certificate your system does not trust: pass --ca FILE to `levers9 config create` (or set LEVERS9_CONTROLPLANE_CA): %w", c.Controlplane, err)
	case strings.Contains(msg, "connection refused"):
		return fmt.Errorf("nothing listens on %s: is the controlplane running (`make up`) and the address right (`levers9 config list`)?: %w", c.Controlplane, err)
	}
	return err
}
