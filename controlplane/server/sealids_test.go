package server_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/controlplane/store"
)

// The sealing scheme before key derivation: SHA-256 of a label and the key
// as the AES key, and a truncated SHA-256 of the key as its ID. Written out
// here so the test does not depend on the code it checks.
func legacyKeyID(secret string) string {
	sum := sha256.Sum256([]byte("levers9 seal key id\x00" + secret))
	return hex.EncodeToString(sum[:8])
}

func legacySeal(t *testing.T, secret string, plaintext, aad []byte) []byte {
	t.Helper()
	k := sha256.Sum256([]byte("levers9 seal key\x00" + secret))
	block, err := aes.NewCipher(k[:])
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	return aead.Seal(nonce, nonce, plaintext, aad)
}

func pgConn(t *testing.T, cfg *config.Config) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), cfg.Database.Postgres.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// TestSealKeyIDRevealsNoHash: the key ID stored beside every sealed row is
// not a hash of the configured key (which would let anyone with a database
// dump test guesses of a passphrase at SHA-256 speed), and the same
// passphrase gives different IDs on two installs (a per-install salt).
func TestSealKeyIDRevealsNoHash(t *testing.T) {
	t.Parallel()
	const passphrase = "correct horse battery staple 42"
	var ids []string
	for range 2 {
		cfg := env.Config(t)
		cfg.Database.Postgres.EncryptionKey = passphrase
		in := controlplanetest.Start(t, cfg, true)
		a := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
		if _, err := v1.NewSecretServiceClient(in.Conn).PutSecret(withToken(context.Background(), a.Token),
			&v1.PutSecretRequest{Name: "x", Values: map[string]string{"K": "v"}}); err != nil {
			t.Fatal(err)
		}
		var id string
		if err := pgConn(t, cfg).QueryRow(context.Background(), `SELECT key_id FROM secrets`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		for _, h := range []string{legacyKeyID(passphrase), hexSHA256(passphrase), hexSHA256("levers9 seal key\x00" + passphrase)} {
			if strings.Contains(h, id) || strings.Contains(id, h[:16]) {
				t.Errorf("key id %s is a hash of the key (%s)", id, h)
			}
		}
		ids = append(ids, id)
	}
	if ids[0] == ids[1] {
		t.Errorf("the same passphrase has the same key id %s on two installs: no per-install salt", ids[0])
	}
}

func hexSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestLegacyRowsResealedOnStart: rows sealed the old way (SHA-256 key, SHA-256
// ID) open after the upgrade, the re-seal on start moves every one to the new
// key ID, and nothing in the database carries the old hash afterwards.
func TestLegacyRowsResealedOnStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := env.Config(t)
	cfg.Database.Postgres.EncryptionKey = keyA
	in := controlplanetest.Start(t, cfg, true)
	a := sealRows(t, in, "db")
	actx := withToken(ctx, a.Token)
	in.Server.Stop()

	// Rewrite every sealed row as the previous release sealed it.
	kr := keyring(t, cfg, keyA)
	db := pgConn(t, cfg)
	old := legacyKeyID(keyA)
	for _, tb := range []struct{ sel, upd string }{
		{`SELECT id, key_id, sealed, 'levers9/secret/' || workspace_id || '/' || name FROM secrets`,
			`UPDATE secrets SET key_id = $2, sealed = $3 WHERE id = $1`},
		{`SELECT id, storage_key_id, storage_sealed, 'levers9/workspace-storage/' || id FROM workspaces WHERE storage_key_id IS NOT NULL`,
			`UPDATE workspaces SET storage_key_id = $2, storage_sealed = $3 WHERE id = $1`},
		{`SELECT id, key_id, key_sealed, '' FROM agent_ca`,
			`UPDATE agent_ca SET key_id = $2, key_sealed = $3 WHERE id = $1`},
	} {
		rows, err := db.Query(ctx, tb.sel)
		if err != nil {
			t.Fatal(err)
		}
		type row struct {
			id, keyID, aad string
			sealed         []byte
		}
		var rs []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.id, &r.keyID, &r.sealed, &r.aad); err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
		}
		rows.Close()
		if len(rs) == 0 {
			t.Fatalf("no rows for %s", tb.sel)
		}
		for _, r := range rs {
			aad := []byte(r.aad)
			if r.aad == "" {
				aad = store.CAAAD(r.id)
			}
			pt, err := kr.Open(r.keyID, r.sealed, aad)
			if err != nil {
				t.Fatalf("%s: %v", r.id, err)
			}
			if _, err := db.Exec(ctx, tb.upd, r.id, old, legacySeal(t, keyA, pt, aad)); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Start the upgraded controlplane on the same key.
	in2 := controlplanetest.Start(t, cfg, true)
	if rec := lastSealLog(t, in2); rec["all_rows_on_current_key"] != true || rec["resealed"] != float64(3) || rec["stranded"] != float64(0) {
		t.Errorf("re-seal log = %v, want 3 resealed (secret, storage, agent CA), none stranded", rec)
	}
	ids := sealedKeyIDs(t, cfg)
	var caID string
	if err := db.QueryRow(ctx, `SELECT key_id FROM agent_ca`).Scan(&caID); err != nil {
		t.Fatal(err)
	}
	for _, id := range append(ids, caID) {
		if id != kr.CurrentID() || id == old {
			t.Errorf("row on key %s after the re-seal, want %s", id, kr.CurrentID())
		}
	}
	// It opens the sealed part to answer.
	if _, err := v1.NewWorkspaceServiceClient(in2.Conn).GetStorageCredentials(actx, &v1.GetStorageCredentialsRequest{}); err != nil {
		t.Errorf("storage credentials after the re-seal: %v", err)
	}
	if _, err := kr.Open(ids[0], mustSealed(t, db, `SELECT sealed FROM secrets`), store.SecretAAD(a.WorkspaceId, "db")); err != nil {
		t.Errorf("secret after the re-seal: %v", err)
	}
	if in2.Server.Agents() == nil {
		controlplanetest.Eventually(t, 10*time.Second, "tunnel endpoint (agent CA opened)", func() bool { return in2.Server.Agents() != nil })
	}
}

func mustSealed(t *testing.T, db *pgx.Conn, q string) []byte {
	t.Helper()
	var b []byte
	if err := db.QueryRow(context.Background(), q).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}
