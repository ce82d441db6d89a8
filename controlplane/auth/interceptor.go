package auth

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// BootstrapHeader is the gRPC metadata key carrying the bootstrap secret
// (REST: Grpc-Metadata-X-Levers9-Bootstrap-Secret).
const BootstrapHeader = "x-levers9-bootstrap-secret"

// Principal is an authenticated caller.
type Principal struct {
	WorkspaceID string
	TokenID     string
}

type principalKey struct{}

// FromContext returns the caller, if the RPC was authenticated.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// WithPrincipal attaches a caller to ctx.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// MustPrincipal returns the caller or an unauthenticated error.
func MustPrincipal(ctx context.Context) (Principal, error) {
	p, ok := FromContext(ctx)
	if !ok {
		return Principal{}, fmt.Errorf("no authenticated caller: %w", errdefs.ErrUnauthenticated)
	}
	return p, nil
}

// TokenStore is what authentication needs from the store.
type TokenStore interface {
	UseToken(ctx context.Context, id string) (store.Token, error)
}

// Authenticator checks bearer tokens.
type Authenticator struct {
	Store TokenStore
	// Public lists full method names that need no token; they check
	// credentials themselves if they need any.
	Public map[string]bool
}

// TokenFromMetadata returns the bearer token of an incoming call, or "".
func TokenFromMetadata(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok {
			return strings.TrimSpace(t)
		}
		if t, ok := strings.CutPrefix(v, "bearer "); ok {
			return strings.TrimSpace(t)
		}
	}
	return ""
}

// BootstrapSecretFromMetadata returns the bootstrap secret a caller sent.
func BootstrapSecretFromMetadata(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(BootstrapHeader); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Authenticate resolves the caller's token to a Principal.
func (a *Authenticator) Authenticate(ctx context.Context) (Principal, error) {
	raw := TokenFromMetadata(ctx)
	if raw == "" {
		return Principal{}, fmt.Errorf("no token: send `authorization: Bearer <token>` (the CLI does this from its context; create one with `levers9 token create`): %w", errdefs.ErrUnauthenticated)
	}
	return a.Check(ctx, raw)
}

// Check resolves a raw token to a Principal.
func (a *Authenticator) Check(ctx context.Context, raw string) (Principal, error) {
	pt, err := ParseToken(raw)
	if err != nil {
		return Principal{}, err
	}
	tok, err := a.Store.UseToken(ctx, pt.ID)
	if errdefs.IsNotFound(err) {
		return Principal{}, fmt.Errorf("token %s is not valid: %w", pt.ID, errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return Principal{}, err
	}
	if !HashMatches(tok.Hash, pt) {
		return Principal{}, fmt.Errorf("token %s is not valid: %w", pt.ID, errdefs.ErrUnauthenticated)
	}
	if tok.RevokedAt != nil {
		return Principal{}, fmt.Errorf("token %s was revoked: %w", pt.ID, errdefs.ErrUnauthenticated)
	}
	return Principal{WorkspaceID: tok.WorkspaceID, TokenID: tok.ID}, nil
}

func (a *Authenticator) authorize(ctx context.Context, method string) (context.Context, error) {
	if a.Public[method] || strings.HasPrefix(method, "/grpc.health.v1.Health/") {
		return ctx, nil
	}
	p, err := a.Authenticate(ctx)
	if err != nil {
		return ctx, errdefs.ToGRPC(err)
	}
	return WithPrincipal(ctx, p), nil
}

// Unary is the unary server interceptor.
func (a *Authenticator) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

// Stream is the streaming server interceptor.
func (a *Authenticator) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, err := a.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return h(srv, &wrappedStream{ServerStream: ss, ctx: ctx})
	}
}

type wrappedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (w *wrappedStream) Context() context.Context { return w.ctx }
