package server_test

import (
	"context"
	"errors"
	"testing"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/controlplane/seal"
	"github.com/levers9/levers9/controlplane/server"
	"github.com/levers9/levers9/controlplane/store"
)

const (
	keyA = "rotation-key-A-aaaaaaaaaaaaaaaa"
	keyB = "rotation-key-B-bbbbbbbbbbbbbbbb"
)

// sealedKeyIDs returns the key ID of every sealed row.
func sealedKeyIDs(t *testing.T, cfg *config.Config) []string {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, cfg.Database.Postgres.ConnString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out []string
	for _, q := range []string{`SELECT key_id FROM secrets`, `SELECT storage_key_id FROM workspaces WHERE storage_key_id IS NOT NULL`} {
		ids, err := st.QueryStringsForTest(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ids...)
	}
	return out
}

// keyring is what a controlplane on cfg's database derives from these keys.
func keyring(t *testing.T, cfg *config.Config, current string, previous ...string) *seal.Keyring {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, cfg.Database.Postgres.ConnString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	salt, err := st.SealSalt(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := seal.NewKeyring(salt, current, previous...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// sealRows bootstraps in, puts a secret for each name (V=value-NAME) and
// sets storage credentials, and returns the admin.
func sealRows(t *testing.T, in *controlplanetest.Instance, names ...string) *v1.AuthorizeResponse {
	t.Helper()
	a := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
	actx := withToken(context.Background(), a.Token)
	sc := v1.NewSecretServiceClient(in.Conn)
	for _, name := range names {
		if _, err := sc.PutSecret(actx, &v1.PutSecretRequest{Name: name, Values: map[string]string{"V": "value-" + name}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v1.NewWorkspaceServiceClient(in.Conn).SetStorageCredentials(actx, &v1.SetStorageCredentialsRequest{
		Credentials: &v1.StorageCredentials{Endpoint: "e", Bucket: "b", AccessKeyId: "k", SecretAccessKey: "s"}}); err != nil {
		t.Fatal(err)
	}
	return a
}

func lastSealLog(t *testing.T, in *controlplanetest.Instance) map[string]any {
	t.Helper()
	recs := in.Logs.Find("sealed rows checked")
	if len(recs) == 0 {
		t.Fatalf("no reseal log line; logs:\n%s", in.Logs.String())
	}
	return recs[len(recs)-1]
}

func TestKeyRotation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := env.Config(t)
	cfg.Database.Postgres.EncryptionKey = keyA

	// Start on key A and seal a few rows.
	in := controlplanetest.Start(t, cfg, true)
	a := sealRows(t, in, "one", "two", "three")
	actx := withToken(ctx, a.Token)
	if rec := lastSealLog(t, in); rec["all_rows_on_current_key"] != true {
		t.Errorf("fresh start: %v", rec)
	}
	in.Server.Stop()

	// Rotate to B with A listed as previous: every row moves to B.
	cfgB := *cfg
	cfgB.Database.Postgres.EncryptionKey = keyB
	cfgB.Database.Postgres.PreviousEncryptionKeys = []string{keyA}
	inB := controlplanetest.Start(t, &cfgB, true)
	rec := lastSealLog(t, inB)
	if rec["all_rows_on_current_key"] != true || rec["resealed"] != float64(5) {
		t.Errorf("rotation log = %v, want all_rows_on_current_key true and 5 resealed (3 secrets, storage, agent CA)", rec)
	}
	idB := keyring(t, cfg, keyB).CurrentID()
	for _, id := range sealedKeyIDs(t, cfg) {
		if id != idB {
			t.Errorf("row still on key %s", id)
		}
	}
	inB.Server.Stop()

	// Drop A: everything still opens with B alone.
	cfgOnlyB := cfgB
	cfgOnlyB.Database.Postgres.PreviousEncryptionKeys = nil
	inOnlyB := controlplanetest.Start(t, &cfgOnlyB, true)
	if rec := lastSealLog(t, inOnlyB); rec["all_rows_on_current_key"] != true || rec["resealed"] != float64(0) {
		t.Errorf("after dropping A: %v", rec)
	}
	if _, err := v1.NewWorkspaceServiceClient(inOnlyB.Conn).GetStorageCredentials(actx, &v1.GetStorageCredentialsRequest{}); err != nil {
		t.Errorf("storage credentials do not open with B alone: %v", err)
	}
	kr := keyring(t, cfg, keyB)
	st, err := store.Open(ctx, cfg.Database.Postgres.ConnString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, name := range []string{"one", "two", "three"} {
		sec, err := st.GetSecret(ctx, a.WorkspaceId, name)
		if err != nil {
			t.Fatal(err)
		}
		pt, err := kr.Open(sec.Sealed.KeyID, sec.Sealed.Bytes, store.SecretAAD(a.WorkspaceId, name))
		if err != nil || string(pt) != `{"V":"value-`+name+`"}` {
			t.Errorf("secret %s with B alone: %q %v", name, pt, err)
		}
	}
}

func TestRotationWithoutPreviousKeyReportsFalse(t *testing.T) {
	t.Parallel()
	cfg := env.Config(t)
	cfg.Database.Postgres.EncryptionKey = keyA
	in := controlplanetest.Start(t, cfg, true)
	a := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
	if _, err := v1.NewSecretServiceClient(in.Conn).PutSecret(withToken(context.Background(), a.Token),
		&v1.PutSecretRequest{Name: "x", Values: map[string]string{"K": "v"}}); err != nil {
		t.Fatal(err)
	}
	in.Server.Stop()
	cfgB := *cfg
	cfgB.Database.Postgres.EncryptionKey = keyB
	inB := controlplanetest.Start(t, &cfgB, true)
	if rec := lastSealLog(t, inB); rec["all_rows_on_current_key"] != false || rec["stranded"] != float64(2) {
		t.Errorf("rotation without the old key: %v, want false with 2 stranded (the secret and the agent CA)", rec)
	}
	if len(inB.Logs.Find("the agent CA key does not open")) != 1 {
		t.Error("no error log about the stranded agent CA")
	}
	if ids := sealedKeyIDs(t, cfg); len(ids) != 1 || ids[0] != keyring(t, cfg, keyA).CurrentID() {
		t.Errorf("the stranded row must stay untouched on A, got %v", ids)
	}
}

func TestRefuseDefaultEncryptionKey(t *testing.T) {
	t.Parallel()
	cfg := env.Config(t)
	cfg.Database.Postgres.EncryptionKey = config.DefaultEncryptionKey
	cfg.RefuseDefaultEncryptionKey = true
	if _, err := server.New(cfg, server.Options{}); !errors.Is(err, config.ErrDefaultKeyRefused) {
		t.Fatalf("New on the shipped key with refusal on: %v", err)
	}
	cfg.RefuseDefaultEncryptionKey = false
	if _, err := server.New(cfg, server.Options{}); err != nil {
		t.Fatalf("New on the shipped key with refusal off: %v", err)
	}
}

func TestShippedDefaultWarnings(t *testing.T) {
	t.Parallel()
	cfg := env.Config(t)
	in := controlplanetest.Start(t, cfg, true)
	if recs := in.Logs.Find("shipped"); len(recs) != 0 {
		t.Errorf("own settings warned: %v", recs)
	}

	cfgDef := env.Config(t)
	cfgDef.Database.Postgres.EncryptionKey = config.DefaultEncryptionKey
	cfgDef.Database.Postgres.Password = config.DefaultPostgresPassword
	cfgDef.Database.Redis.Password = ""
	inDef := controlplanetest.Start(t, cfgDef, false)
	var keys []string
	for _, r := range inDef.Logs.Records() {
		if r["shipped_default"] == true && r["level"] == "WARN" {
			keys = append(keys, r["key"].(string))
		}
	}
	want := map[string]bool{"database.postgres.encryptionKey": true, "database.postgres.password": true, "database.redis.password": true}
	if len(keys) != 3 {
		t.Fatalf("warnings for %v, want one each for %v", keys, want)
	}
	for _, k := range keys {
		if !want[k] {
			t.Errorf("unexpected warning for %s", k)
		}
	}
}
