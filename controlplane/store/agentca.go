package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// CARow is the agent CA: its certificate and sealed key.
type CARow struct {
	CertPEM string
	Key     Sealed
}

// CAAAD binds the CA key's sealed value to its row.
func CAAAD(id string) []byte { return []byte("levers9/agent-ca/" + id) }

const caLock = 0x6c396361 // "l9ca"

// GetOrCreateCA returns CA row id, creating it with create the first time.
// Replicas starting together create exactly one.
func (s *Store) GetOrCreateCA(ctx context.Context, id string, create func() (CARow, error)) (CARow, error) {
	var out CARow
	err := s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, caLock); err != nil {
			return wrap("CA lock", err)
		}
		err := tx.QueryRow(ctx, `SELECT cert_pem, key_id, key_sealed FROM agent_ca WHERE id = $1`, id).
			Scan(&out.CertPEM, &out.Key.KeyID, &out.Key.Bytes)
		if err == nil {
			return nil
		}
		if err != pgx.ErrNoRows {
			return wrap("read CA", err)
		}
		if out, err = create(); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO agent_ca (id, cert_pem, key_id, key_sealed) VALUES ($1, $2, $3, $4)`,
			id, out.CertPEM, out.Key.KeyID, out.Key.Bytes)
		return wrap("create CA", err)
	})
	return out, err
}
