package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// RegistryAAD binds a registry login's sealed password to its workspace and
// registry host.
func RegistryAAD(wsID, host string) []byte { return []byte("levers9/registry/" + wsID + "/" + host) }

// RegistryCredential is a row of registry_credentials: a workspace's login
// to one image registry.
type RegistryCredential struct {
	ID          string
	WorkspaceID string
	Host        string
	Username    string
	// Sealed is the password or token; empty in lists.
	Sealed    Sealed
	CreatedAt time.Time
	UpdatedAt time.Time
}

// PutRegistryCredential creates or replaces the login for (workspace,
// host) and returns the stored row without its sealed password.
func (s *Store) PutRegistryCredential(ctx context.Context, c RegistryCredential) (RegistryCredential, error) {
	var out RegistryCredential
	err := s.pool.QueryRow(ctx, `INSERT INTO registry_credentials (id, workspace_id, host, username, key_id, sealed)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (workspace_id, host) DO UPDATE
		SET username = excluded.username, key_id = excluded.key_id, sealed = excluded.sealed, updated_at = now()
		RETURNING id, workspace_id, host, username, created_at, updated_at`,
		c.ID, c.WorkspaceID, c.Host, c.Username, c.Sealed.KeyID, c.Sealed.Bytes).
		Scan(&out.ID, &out.WorkspaceID, &out.Host, &out.Username, &out.CreatedAt, &out.UpdatedAt)
	return out, wrap("put the login to registry "+c.Host, err)
}

// ListRegistryCredentials lists a workspace's logins by host, without
// their passwords.
func (s *Store) ListRegistryCredentials(ctx context.Context, wsID string) ([]RegistryCredential, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, workspace_id, host, username, created_at, updated_at
		FROM registry_credentials WHERE workspace_id = $1 ORDER BY host`, wsID)
	if err != nil {
		return nil, wrap("list registry logins", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RegistryCredential, error) {
		var c RegistryCredential
		err := r.Scan(&c.ID, &c.WorkspaceID, &c.Host, &c.Username, &c.CreatedAt, &c.UpdatedAt)
		return c, err
	})
	return out, wrap("list registry logins", err)
}

// GetRegistryCredential returns one login with its sealed password; a host
// the workspace has no login for is not found.
func (s *Store) GetRegistryCredential(ctx context.Context, wsID, host string) (RegistryCredential, error) {
	var c RegistryCredential
	err := s.pool.QueryRow(ctx, `SELECT id, workspace_id, host, username, key_id, sealed, created_at, updated_at
		FROM registry_credentials WHERE workspace_id = $1 AND host = $2`, wsID, host).
		Scan(&c.ID, &c.WorkspaceID, &c.Host, &c.Username, &c.Sealed.KeyID, &c.Sealed.Bytes, &c.CreatedAt, &c.UpdatedAt)
	return c, wrap("get the login to registry "+host, err)
}

// DeleteRegistryCredential forgets a login; another workspace's is not
// found.
func (s *Store) DeleteRegistryCredential(ctx context.Context, wsID, host string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM registry_credentials WHERE workspace_id = $1 AND host = $2`, wsID, host)
	if err != nil {
		return wrap("delete the login to registry "+host, err)
	}
	if tag.RowsAffected() == 0 {
		return wrap("delete the login to registry "+host, pgx.ErrNoRows)
	}
	return nil
}
