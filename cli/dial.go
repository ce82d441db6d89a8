package cli

import (
	"context"
	"errors"

	"google.golang.org/grpc"

	"github.com/levers9/levers9/internal/clientconfig"
)

// UseTLS decides TLS for an address: port 443 always; other ports only when
// the context says tls = true or LEVERS9_CONTROLPLANE_TLS=true.
func UseTLS(addr string, ctxTLS bool, getenv func(string) string) (bool, error) {
	return clientconfig.UseTLS(addr, ctxTLS, getenv)
}

// Dial connects to the context's controlplane.
func Dial(c Context, getenv func(string) string) (*grpc.ClientConn, error) {
	return clientconfig.Dial(c, getenv)
}

// WithToken adds the bearer token to outgoing calls.
func WithToken(ctx context.Context, token string) context.Context {
	return clientconfig.WithToken(ctx, token)
}

func explainTransport(err error, c Context, useTLS bool) error {
	return clientconfig.ExplainTransport(err, c, useTLS)
}

var errNoToken = errors.New("this context has no token: set LEVERS9_TOKEN, or run `levers9 config create NAME --controlplane HOST:PORT` and enter one")
