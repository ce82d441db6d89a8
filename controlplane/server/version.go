package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/levers9/levers9/internal/version"
)

// versionUnary puts the controlplane's version in the header of every
// unary answer (refusals too: grpc-go sends headers set before the handler
// failed). `levers9 version` reads it from the health check, which needs
// no token. The version is not a secret: /healthz shows it as well.
func versionUnary() grpc.UnaryServerInterceptor {
	md := metadata.Pairs(version.Header, version.String())
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		// SetHeader fails only outside a server call or after headers went
		// out, neither of which can happen before the handler ran.
		_ = grpc.SetHeader(ctx, md)
		return handler(ctx, req)
	}
}
