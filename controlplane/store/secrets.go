package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Secret is a row of secrets.
type Secret struct {
	ID          string
	WorkspaceID string
	Name        string
	Keys        []string
	Sealed      Sealed
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// PutSecret creates or replaces a secret by (workspace, name) and returns
// the stored row (an existing secret keeps its ID and creation time).
func (s *Store) PutSecret(ctx context.Context, sec Secret) (Secret, error) {
	var out Secret
	if sec.Keys == nil {
		sec.Keys = []string{} // NULL would break value_keys' NOT NULL
	}
	err := s.pool.QueryRow(ctx, `INSERT INTO secrets (id, workspace_id, name, value_keys, key_id, sealed)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (workspace_id, name) DO UPDATE
		SET value_keys = excluded.value_keys, key_id = excluded.key_id, sealed = excluded.sealed, updated_at = now()
		RETURNING id, workspace_id, name, value_keys, created_at, updated_at`,
		sec.ID, sec.WorkspaceID, sec.Name, sec.Keys, sec.Sealed.KeyID, sec.Sealed.Bytes).
		Scan(&out.ID, &out.WorkspaceID, &out.Name, &out.Keys, &out.CreatedAt, &out.UpdatedAt)
	return out, wrap("put secret "+sec.Name, err)
}

// ListSecrets lists a workspace's secrets by name, without their values.
func (s *Store) ListSecrets(ctx context.Context, wsID string) ([]Secret, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, workspace_id, name, value_keys, created_at, updated_at
		FROM secrets WHERE workspace_id = $1 ORDER BY name`, wsID)
	if err != nil {
		return nil, wrap("list secrets", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Secret, error) {
		var sec Secret
		err := r.Scan(&sec.ID, &sec.WorkspaceID, &sec.Name, &sec.Keys, &sec.CreatedAt, &sec.UpdatedAt)
		return sec, err
	})
	return out, wrap("list secrets", err)
}

// GetSecret returns one secret with its sealed value.
func (s *Store) GetSecret(ctx context.Context, wsID, name string) (Secret, error) {
	var sec Secret
	err := s.pool.QueryRow(ctx, `SELECT id, workspace_id, name, value_keys, key_id, sealed, created_at, updated_at
		FROM secrets WHERE workspace_id = $1 AND name = $2`, wsID, name).
		Scan(&sec.ID, &sec.WorkspaceID, &sec.Name, &sec.Keys, &sec.Sealed.KeyID, &sec.Sealed.Bytes, &sec.CreatedAt, &sec.UpdatedAt)
	return sec, wrap("get secret "+name, err)
}

// DeleteSecret deletes a secret; another workspace's secret is not found.
func (s *Store) DeleteSecret(ctx context.Context, wsID, name string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM secrets WHERE workspace_id = $1 AND name = $2`, wsID, name)
	if err != nil {
		return wrap("delete secret "+name, err)
	}
	if tag.RowsAffected() == 0 {
		return wrap("delete secret "+name, pgx.ErrNoRows)
	}
	return nil
}
