package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/levers9/levers9/internal/errdefs"
)

// Workspace is a row of workspaces.
type Workspace struct {
	ID                    string
	Name                  string
	CreatedAt             time.Time
	HasStorageCredentials bool
}

// StoragePublic is the non-secret part of a workspace's storage credentials.
type StoragePublic struct {
	Endpoint    string `json:"endpoint"`
	Bucket      string `json:"bucket"`
	AccessKeyID string `json:"accessKeyId"`
	Region      string `json:"region"`
}

// Sealed is a value sealed by the seal package, with the ID of its key.
type Sealed struct {
	KeyID string
	Bytes []byte
}

// ErrBootstrapOver means a workspace already exists.
var ErrBootstrapOver = fmt.Errorf("bootstrap is over: a workspace exists, authorize with a token instead: %w", errdefs.ErrFailedPrecondition)

// bootstrapLock is the advisory lock key serialising bootstraps.
const bootstrapLock = 0x6c397273 // "l9rs"

// Bootstrap creates the first workspace and its admin token in one
// transaction, or returns ErrBootstrapOver if any workspace exists.
// Concurrent calls yield exactly one workspace. tok's Role is set to admin.
func (s *Store) Bootstrap(ctx context.Context, ws Workspace, tok Token) error {
	tok.Role = RoleAdmin
	return s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, bootstrapLock); err != nil {
			return wrap("bootstrap lock", err)
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workspaces)`).Scan(&exists); err != nil {
			return wrap("bootstrap check", err)
		}
		if exists {
			return ErrBootstrapOver
		}
		if err := insertWorkspace(ctx, tx, ws); err != nil {
			return err
		}
		return insertToken(ctx, tx, tok)
	})
}

// CreateWorkspace inserts a workspace.
func (s *Store) CreateWorkspace(ctx context.Context, ws Workspace) error {
	return insertWorkspace(ctx, s.pool, ws)
}

func insertWorkspace(ctx context.Context, db dbtx, ws Workspace) error {
	_, err := db.Exec(ctx, `INSERT INTO workspaces (id, name, created_at) VALUES ($1, $2, $3)`, ws.ID, ws.Name, ws.CreatedAt)
	return wrap("create workspace "+ws.Name, err)
}

// GetWorkspace returns workspace id.
func (s *Store) GetWorkspace(ctx context.Context, id string) (Workspace, error) {
	var ws Workspace
	err := s.pool.QueryRow(ctx, `SELECT id, name, created_at, storage_sealed IS NOT NULL FROM workspaces WHERE id = $1`, id).
		Scan(&ws.ID, &ws.Name, &ws.CreatedAt, &ws.HasStorageCredentials)
	return ws, wrap("get workspace "+id, err)
}

// SetStorageCredentials stores a workspace's storage credentials.
func (s *Store) SetStorageCredentials(ctx context.Context, wsID string, pub StoragePublic, sealed Sealed) error {
	b, err := json.Marshal(pub)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE workspaces SET storage_public = $2, storage_key_id = $3, storage_sealed = $4 WHERE id = $1`,
		wsID, b, sealed.KeyID, sealed.Bytes)
	if err != nil {
		return wrap("set storage credentials of "+wsID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("workspace %s: %w", wsID, errdefs.ErrNotFound)
	}
	return nil
}

// GetStorageCredentials returns a workspace's storage credentials, sealed.
func (s *Store) GetStorageCredentials(ctx context.Context, wsID string) (StoragePublic, Sealed, error) {
	var (
		pub    StoragePublic
		raw    []byte
		sealed Sealed
		keyID  *string
	)
	err := s.pool.QueryRow(ctx, `SELECT storage_public, storage_key_id, storage_sealed FROM workspaces WHERE id = $1`, wsID).
		Scan(&raw, &keyID, &sealed.Bytes)
	if err != nil {
		return pub, sealed, wrap("get storage credentials of "+wsID, err)
	}
	if keyID == nil {
		return pub, sealed, fmt.Errorf("workspace %s has no storage credentials: %w", wsID, errdefs.ErrNotFound)
	}
	sealed.KeyID = *keyID
	if err := json.Unmarshal(raw, &pub); err != nil {
		return pub, sealed, fmt.Errorf("decode storage credentials of %s: %w", wsID, err)
	}
	return pub, sealed, nil
}
