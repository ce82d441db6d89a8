package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

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

// Dial connects to the context's controlplane.
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

// explainTransport turns the opaque errors of a TLS/plaintext mismatch into
// advice.
func explainTransport(err error, c Context, useTLS bool) error {
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

var errNoToken = errors.New("this context has no token: set LEVERS9_TOKEN, or run `levers9 config create NAME --controlplane HOST:PORT` and enter one")
