package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/levers9/levers9/controlplane/seal"
)

// SecretAAD binds a secret's sealed value to its workspace and name.
func SecretAAD(wsID, name string) []byte { return []byte("levers9/secret/" + wsID + "/" + name) }

// StorageAAD binds a workspace's sealed storage credentials to it.
func StorageAAD(wsID string) []byte { return []byte("levers9/workspace-storage/" + wsID) }

// SealSalt is the install's salt for passphrase sealing keys: one row,
// made by migration 00006 and never changed.
func (s *Store) SealSalt(ctx context.Context) ([]byte, error) {
	var salt []byte
	if err := s.pool.QueryRow(ctx, `SELECT salt FROM seal_salt`).Scan(&salt); err != nil {
		return nil, wrap("read the seal salt", err)
	}
	return salt, nil
}

// ResealReport says what a reseal pass did.
type ResealReport struct {
	Resealed int
	// Stranded counts rows sealed by a key the keyring does not hold, or that
	// failed to open; they stay as they are.
	Stranded int
	// AllOnCurrentKey is true when every sealed row is on the current key.
	AllOnCurrentKey bool
}

// Reseal re-seals every row that is not on the keyring's current key, rows
// of an old-style key ID (the derivation before seal's HKDF/scrypt) too. Each
// row is re-sealed in its own short transaction with the row locked, so a
// concurrent write is never lost, and a crash halfway leaves every row
// readable.
func (s *Store) Reseal(ctx context.Context, kr *seal.Keyring) (ResealReport, error) {
	var rep ResealReport
	cur := kr.CurrentID()
	for _, t := range []struct {
		table, selectOld, selectRow, update string
		aad                                 func(a, b string) []byte
	}{
		{
			table:     "secrets",
			selectOld: `SELECT id FROM secrets WHERE key_id <> $1`,
			selectRow: `SELECT workspace_id, name, key_id, sealed FROM secrets WHERE id = $1 FOR UPDATE`,
			update:    `UPDATE secrets SET key_id = $2, sealed = $3 WHERE id = $1`,
			aad:       SecretAAD,
		},
		{
			table:     "registry_credentials",
			selectOld: `SELECT id FROM registry_credentials WHERE key_id <> $1`,
			selectRow: `SELECT workspace_id, host, key_id, sealed FROM registry_credentials WHERE id = $1 FOR UPDATE`,
			update:    `UPDATE registry_credentials SET key_id = $2, sealed = $3 WHERE id = $1`,
			aad:       RegistryAAD,
		},
		{
			table:     "workspaces",
			selectOld: `SELECT id FROM workspaces WHERE storage_key_id <> $1`,
			selectRow: `SELECT id, '', storage_key_id, storage_sealed FROM workspaces WHERE id = $1 FOR UPDATE`,
			update:    `UPDATE workspaces SET storage_key_id = $2, storage_sealed = $3 WHERE id = $1`,
			aad:       func(ws, _ string) []byte { return StorageAAD(ws) },
		},
		{
			table:     "agent_ca",
			selectOld: `SELECT id FROM agent_ca WHERE key_id <> $1`,
			selectRow: `SELECT id, '', key_id, key_sealed FROM agent_ca WHERE id = $1 FOR UPDATE`,
			update:    `UPDATE agent_ca SET key_id = $2, key_sealed = $3 WHERE id = $1`,
			aad:       func(id, _ string) []byte { return CAAAD(id) },
		},
	} {
		rows, err := s.pool.Query(ctx, t.selectOld, cur)
		if err != nil {
			return rep, wrap("reseal: list "+t.table, err)
		}
		idList, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return rep, wrap("reseal: list "+t.table, err)
		}
		for _, id := range idList {
			err := s.tx(ctx, func(tx pgx.Tx) error {
				var a, b, keyID string
				var sealed []byte
				if err := tx.QueryRow(ctx, t.selectRow, id).Scan(&a, &b, &keyID, &sealed); err != nil {
					return wrap("reseal: read "+t.table+" "+id, err)
				}
				if keyID == cur {
					return nil
				}
				pt, err := kr.Open(keyID, sealed, t.aad(a, b))
				if err != nil {
					return fmt.Errorf("reseal %s %s: %w", t.table, id, err)
				}
				newID, newSealed, err := kr.Seal(pt, t.aad(a, b))
				clear(pt)
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, t.update, id, newID, newSealed)
				if err != nil {
					return wrap("reseal: write "+t.table+" "+id, err)
				}
				rep.Resealed++
				return nil
			})
			switch {
			case errors.Is(err, seal.ErrUnknownKey), errors.Is(err, seal.ErrOpen):
				rep.Stranded++
				s.log.Warn("sealed row cannot be opened with any configured key", "table", t.table, "id", id, "err", err)
			case err != nil:
				return rep, err
			}
		}
	}
	var remaining int
	err := s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM secrets WHERE key_id <> $1)
		+ (SELECT count(*) FROM workspaces WHERE storage_key_id <> $1)
		+ (SELECT count(*) FROM agent_ca WHERE key_id <> $1)
		+ (SELECT count(*) FROM registry_credentials WHERE key_id <> $1)`, cur).Scan(&remaining)
	if err != nil {
		return rep, wrap("reseal: count", err)
	}
	rep.AllOnCurrentKey = remaining == 0
	return rep, nil
}
