package server_test

import (
	"context"
	"os"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

var env *controlplanetest.Env

func TestMain(m *testing.M) {
	os.Exit(controlplanetest.Main(m, &env))
}

func withToken(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

func withBootstrap(ctx context.Context, secret string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-levers9-bootstrap-secret", secret)
}

// bootstrap creates the first workspace and returns its admin token.
func bootstrap(t *testing.T, conn *grpc.ClientConn, secret string) *v1.AuthorizeResponse {
	t.Helper()
	resp, err := v1.NewAuthServiceClient(conn).Authorize(withBootstrap(context.Background(), secret), &v1.AuthorizeRequest{})
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	return resp
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Errorf("%s: code %v (%v), want %v", what, got, err, code)
	}
}
