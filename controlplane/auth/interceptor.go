package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// BootstrapHeader is the gRPC metadata key carrying the bootstrap secret
// (REST: Grpc-Metadata-X-Levers9-Bootstrap-Secret).
const BootstrapHeader = "x-levers9-bootstrap-secret"

// Principal is an authenticated caller.
type Principal struct {
	WorkspaceID string
	TokenID     string
	Role        store.Role
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

// DefaultRecheck is how often an open stream's token is checked again.
const DefaultRecheck = 2 * time.Second

// Authenticator checks bearer tokens and their roles (roles.go) on every
// call, and keeps checking during streams: a stream whose token is revoked,
// or whose role no longer allows the call, ends within Recheck with
// Unauthenticated or PermissionDenied.
type Authenticator struct {
	Store TokenStore
	// Clock times the re-checks; nil is the wall clock.
	Clock clock.Clock
	// Recheck is the period of a stream's re-check; zero is DefaultRecheck.
	Recheck time.Duration
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
	return Principal{WorkspaceID: tok.WorkspaceID, TokenID: tok.ID, Role: tok.Role}, nil
}

// authorize authenticates a call to method and checks its role. public is
// true for methods that need no token (ctx is then returned as is).
func (a *Authenticator) authorize(ctx context.Context, method string) (_ context.Context, public bool, err error) {
	if IsPublic(method) {
		return ctx, true, nil
	}
	p, err := a.Authenticate(ctx)
	if err == nil {
		err = Allowed(method, p.Role)
	}
	if err != nil {
		return ctx, false, errdefs.ToGRPC(err)
	}
	return WithPrincipal(ctx, p), false, nil
}

// Unary is the unary server interceptor.
func (a *Authenticator) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, _, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

// Stream is the streaming server interceptor. Besides the check at the
// start, it re-checks the token every Recheck while the stream is open and
// cancels the stream's context when the token was revoked or its role no
// longer allows the call; the client then gets that refusal as the
// stream's status.
func (a *Authenticator) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, public, err := a.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		if public {
			return h(srv, ss)
		}
		ctx, cancel := context.WithCancelCause(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.watch(ctx, cancel, TokenFromMetadata(ctx), info.FullMethod)
		}()
		err = h(srv, &wrappedStream{ServerStream: ss, ctx: ctx})
		cancel(nil)
		wg.Wait()
		if cause := context.Cause(ctx); errors.Is(cause, errRefused) {
			return errdefs.ToGRPC(cause)
		}
		return err
	}
}

// errRefused marks a stream ended by a re-check, as the context's cause.
var errRefused = errors.New("stream ended")

// watch re-checks raw every Recheck until ctx ends, and cancels ctx with
// the refusal when the token no longer authenticates or its role no longer
// allows method. A check that fails for another reason (Postgres briefly
// away) keeps the stream: it was allowed, and the next check decides.
func (a *Authenticator) watch(ctx context.Context, cancel context.CancelCauseFunc, raw, method string) {
	every := a.Recheck
	if every <= 0 {
		every = DefaultRecheck
	}
	tick := clock.OrReal(a.Clock).NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		p, err := a.Check(ctx, raw)
		if err == nil {
			err = Allowed(method, p.Role)
		}
		if errors.Is(err, errdefs.ErrUnauthenticated) || errors.Is(err, errdefs.ErrPermissionDenied) {
			cancel(fmt.Errorf("%w: %w", errRefused, err))
			return
		}
	}
}

type wrappedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (w *wrappedStream) Context() context.Context { return w.ctx }
