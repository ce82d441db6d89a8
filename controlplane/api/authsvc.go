package api

import (
	"context"
	"fmt"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

// AuthMethod is Authorize's full gRPC method name; it takes no token.
const AuthMethod = "/levers9.v1.AuthService/Authorize"

// ErrBootstrapOff is returned when no bootstrap secret is configured.
//
//lint:ignore ST1005 the documented message starts with a capital.
var ErrBootstrapOff = fmt.Errorf("Bootstrap is off on this controlplane: set LEVERS9_BOOTSTRAP_SECRET (or controlplane.auth.bootstrapSecret) on the controlplane to create the first workspace: %w", errdefs.ErrFailedPrecondition)

// AuthService implements levers9.v1.AuthService.
type AuthService struct {
	v1.UnimplementedAuthServiceServer
	*Deps
	Auth *auth.Authenticator
}

// Authorize checks a token, or bootstraps the first workspace.
func (s *AuthService) Authorize(ctx context.Context, req *v1.AuthorizeRequest) (*v1.AuthorizeResponse, error) {
	resp, err := s.authorize(ctx, req)
	return resp, errdefs.ToGRPC(err)
}

func (s *AuthService) authorize(ctx context.Context, req *v1.AuthorizeRequest) (*v1.AuthorizeResponse, error) {
	if raw := auth.TokenFromMetadata(ctx); raw != "" {
		p, err := s.Auth.Check(ctx, raw)
		if err != nil {
			return nil, err
		}
		ws, err := s.Store.GetWorkspace(ctx, p.WorkspaceID)
		if err != nil {
			return nil, err
		}
		return &v1.AuthorizeResponse{WorkspaceId: ws.ID, WorkspaceName: ws.Name, TokenId: p.TokenID}, nil
	}
	if s.BootstrapSecret == "" {
		return nil, ErrBootstrapOff
	}
	presented := auth.BootstrapSecretFromMetadata(ctx)
	if presented == "" {
		return nil, fmt.Errorf("no token and no bootstrap secret: send a token, or the bootstrap secret as %s metadata: %w", auth.BootstrapHeader, errdefs.ErrUnauthenticated)
	}
	if !auth.SecretMatches(presented, s.BootstrapSecret) {
		s.Log.Warn("bootstrap refused: wrong secret")
		return nil, fmt.Errorf("the bootstrap secret is wrong: %w", errdefs.ErrPermissionDenied)
	}
	name := req.GetWorkspaceName()
	if name == "" {
		name = "default"
	}
	if err := checkName("workspace_name", name); err != nil {
		return nil, err
	}
	now := s.now()
	ws := store.Workspace{ID: ids.New("ws"), Name: name, CreatedAt: now}
	tokID, token, hash := auth.Mint()
	err := s.Store.Bootstrap(ctx, ws, store.Token{ID: tokID, WorkspaceID: ws.ID, Name: "admin", Hash: hash, CreatedAt: now})
	if err != nil {
		return nil, err
	}
	s.Log.Info("bootstrapped the first workspace", "workspace_id", ws.ID, "token_id", tokID)
	s.publish(ctx, bus.Event{Workspace: ws.ID, Kind: "workspace.bootstrapped", Object: ws.ID})
	return &v1.AuthorizeResponse{WorkspaceId: ws.ID, WorkspaceName: ws.Name, Token: token, Bootstrapped: true, TokenId: tokID}, nil
}
