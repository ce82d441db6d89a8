package api

import (
	"context"
	"fmt"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// TokenService implements levers9.v1.TokenService.
type TokenService struct {
	v1.UnimplementedTokenServiceServer
	*Deps
}

func tokenPB(t store.Token) *v1.Token {
	return &v1.Token{Id: t.ID, Name: t.Name, WorkspaceId: t.WorkspaceID, CreatedAt: ts(&t.CreatedAt),
		LastUsedAt: ts(t.LastUsedAt), RevokedAt: ts(t.RevokedAt), Revoked: t.RevokedAt != nil, Role: rolePB[t.Role]}
}

// rolePB maps the store's roles to the API's; roleFromPB is its inverse.
var rolePB = map[store.Role]v1.Role{
	store.RoleAdmin:       v1.Role_ROLE_ADMIN,
	store.RoleMember:      v1.Role_ROLE_MEMBER,
	store.RoleMachineJoin: v1.Role_ROLE_MACHINE_JOIN,
}

// roleFromPB reads a requested role; unspecified is member.
func roleFromPB(r v1.Role) (store.Role, error) {
	if r == v1.Role_ROLE_UNSPECIFIED {
		return store.RoleMember, nil
	}
	for sr, pr := range rolePB {
		if pr == r {
			return sr, nil
		}
	}
	return "", errInvalid("role", fmt.Sprintf("%d is unknown: use ROLE_ADMIN, ROLE_MEMBER or ROLE_MACHINE_JOIN", r))
}

// CreateToken mints a token in the caller's workspace, with the requested
// role (member when none is given).
func (s *TokenService) CreateToken(ctx context.Context, req *v1.CreateTokenRequest) (*v1.CreateTokenResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	name := req.GetName()
	if name == "" {
		name = "token"
	}
	if err := checkName("name", name); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	role, err := roleFromPB(req.GetRole())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	id, secret, hash := auth.Mint()
	t := store.Token{ID: id, WorkspaceID: p.WorkspaceID, Name: name, Role: role, Hash: hash, CreatedAt: s.now()}
	if err := s.Store.CreateToken(ctx, t); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.Log.Info("token created", "workspace_id", p.WorkspaceID, "token_id", id, "role", string(role), "by", p.TokenID, "audit", true)
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "token.created", Object: id})
	return &v1.CreateTokenResponse{Token: tokenPB(t), Secret: secret}, nil
}

// ListTokens lists the caller's workspace's tokens.
func (s *TokenService) ListTokens(ctx context.Context, req *v1.ListTokensRequest) (*v1.ListTokensResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	list, err := s.Store.ListTokens(ctx, p.WorkspaceID, req.GetIncludeRevoked())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	resp := &v1.ListTokensResponse{}
	for _, t := range list {
		resp.Tokens = append(resp.Tokens, tokenPB(t))
	}
	return resp, nil
}

// RevokeToken revokes a token of the caller's workspace.
func (s *TokenService) RevokeToken(ctx context.Context, req *v1.RevokeTokenRequest) (*v1.RevokeTokenResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if req.GetId() == "" {
		return nil, errdefs.ToGRPC(errInvalid("id", "is required"))
	}
	t, err := s.Store.RevokeToken(ctx, p.WorkspaceID, req.GetId())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.Log.Info("token revoked", "workspace_id", p.WorkspaceID, "token_id", t.ID, "by", p.TokenID)
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "token.revoked", Object: t.ID})
	return &v1.RevokeTokenResponse{Token: tokenPB(t)}, nil
}
