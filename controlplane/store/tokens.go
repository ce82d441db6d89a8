package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// Role is what a token may do: a closed set, also enforced by Postgres
// (tokens_role_known, migration 00005). A token's role is set when it is
// created and never changes; controlplane/auth/roles.go maps each RPC to the
// roles that may call it.
type Role string

const (
	// RoleAdmin may do everything. The bootstrap token and every token made
	// before roles existed are admin.
	RoleAdmin Role = "admin"
	// RoleMember runs and reads tasks and manages secrets by name; no
	// tokens, no machines.
	RoleMember Role = "member"
	// RoleMachineJoin may only create machines (join scripts, CI that
	// enrolls boxes).
	RoleMachineJoin Role = "machine-join"
)

// Roles lists every role.
func Roles() []Role { return []Role{RoleAdmin, RoleMember, RoleMachineJoin} }

// Valid reports whether r is one of Roles.
func (r Role) Valid() bool { return slices.Contains(Roles(), r) }

// Token is a row of tokens. Hash is the SHA-256 of the token's secret.
type Token struct {
	ID          string
	WorkspaceID string
	Name        string
	Role        Role
	Hash        []byte
	CreatedAt   time.Time
	LastUsedAt  *time.Time
	RevokedAt   *time.Time
}

const tokenColumns = `id, workspace_id, name, role, hash, created_at, last_used_at, revoked_at`

func scanToken(row interface{ Scan(...any) error }) (Token, error) {
	var t Token
	err := row.Scan(&t.ID, &t.WorkspaceID, &t.Name, &t.Role, &t.Hash, &t.CreatedAt, &t.LastUsedAt, &t.RevokedAt)
	return t, err
}

// insertToken refuses a token without a known role: there is no default.
func insertToken(ctx context.Context, db dbtx, t Token) error {
	if !t.Role.Valid() {
		return fmt.Errorf("create token %s: role %q: must be one of %v: %w", t.ID, t.Role, Roles(), errdefs.ErrInvalidArgument)
	}
	_, err := db.Exec(ctx, `INSERT INTO tokens (id, workspace_id, name, role, hash, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
		t.ID, t.WorkspaceID, t.Name, t.Role, t.Hash, t.CreatedAt)
	return wrap("create token "+t.ID, err)
}

// CreateToken inserts a token. Its Role is required.
func (s *Store) CreateToken(ctx context.Context, t Token) error {
	return insertToken(ctx, s.pool, t)
}

// UseToken returns token id for authentication and records its use. It runs
// on every RPC, so last_used_at is written at most once a minute per token
// rather than on each call; one round trip either way.
func (s *Store) UseToken(ctx context.Context, id string) (Token, error) {
	t, err := scanToken(s.pool.QueryRow(ctx, `WITH touched AS (
			UPDATE tokens SET last_used_at = now()
			WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute'))
		SELECT `+tokenColumns+` FROM tokens WHERE id = $1`, id))
	return t, wrap("look up token "+id, err)
}

// ListTokens lists a workspace's tokens, newest first.
func (s *Store) ListTokens(ctx context.Context, wsID string, includeRevoked bool) ([]Token, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tokenColumns+` FROM tokens
		WHERE workspace_id = $1 AND ($2 OR revoked_at IS NULL) ORDER BY created_at DESC, id`, wsID, includeRevoked)
	if err != nil {
		return nil, wrap("list tokens", err)
	}
	defer rows.Close()
	var out []Token
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, wrap("list tokens", err)
		}
		out = append(out, t)
	}
	return out, wrap("list tokens", rows.Err())
}

// RevokeToken revokes token id of workspace wsID. Revoking twice keeps the
// first time. A token of another workspace is not found.
func (s *Store) RevokeToken(ctx context.Context, wsID, id string) (Token, error) {
	t, err := scanToken(s.pool.QueryRow(ctx, `UPDATE tokens SET revoked_at = coalesce(revoked_at, now())
		WHERE id = $1 AND workspace_id = $2 RETURNING `+tokenColumns, id, wsID))
	if err != nil {
		return t, fmt.Errorf("revoke token: %w", wrap("token "+id, err))
	}
	return t, nil
}
