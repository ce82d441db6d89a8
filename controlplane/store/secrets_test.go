package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/levers9/levers9/controlplane/seal"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

const (
	keyA = "store-test-key-A-aaaaaaaaaaaaaaa"
	keyB = "store-test-key-B-bbbbbbbbbbbbbbb"
	keyC = "store-test-key-C-ccccccccccccccc"
)

func keyring(t *testing.T, current string, previous ...string) *seal.Keyring {
	t.Helper()
	kr, err := seal.NewKeyring([]byte("store-test-salt-0123456789abcdef"), current, previous...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// putSecret seals value for (wsID, name) with kr and stores it.
func putSecret(t *testing.T, st *store.Store, kr *seal.Keyring, wsID, name, value string, keys ...string) store.Secret {
	t.Helper()
	keyID, sealed, err := kr.Seal([]byte(value), store.SecretAAD(wsID, name))
	if err != nil {
		t.Fatal(err)
	}
	out, err := st.PutSecret(context.Background(), store.Secret{ID: ids.New("sec"), WorkspaceID: wsID, Name: name, Keys: keys,
		Sealed: store.Sealed{KeyID: keyID, Bytes: sealed}})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSecrets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	kr := keyring(t, keyA)
	ws, other := newWorkspace(t, st), newWorkspace(t, st)

	first := putSecret(t, st, kr, ws.ID, "db", `{"USER":"u"}`, "USER")
	putSecret(t, st, kr, ws.ID, "api", `{"K":"v"}`, "K")
	putSecret(t, st, kr, other.ID, "db", `{"USER":"theirs"}`, "USER")

	// A second put replaces the value and keys but keeps the ID and
	// creation time.
	second := putSecret(t, st, kr, ws.ID, "db", `{"PASSWORD":"p","USER":"u2"}`, "PASSWORD", "USER")
	if second.ID != first.ID || !second.CreatedAt.Equal(first.CreatedAt) || second.UpdatedAt.Before(first.UpdatedAt) || len(second.Keys) != 2 {
		t.Errorf("replace: %+v after %+v", second, first)
	}
	got, err := st.GetSecret(ctx, ws.ID, "db")
	if err != nil {
		t.Fatal(err)
	}
	if pt, err := kr.Open(got.Sealed.KeyID, got.Sealed.Bytes, store.SecretAAD(ws.ID, "db")); err != nil || string(pt) != `{"PASSWORD":"p","USER":"u2"}` {
		t.Errorf("stored value opens to %q, %v", pt, err)
	}
	// The AAD binds the value to its workspace and name.
	for _, aad := range [][]byte{store.SecretAAD(ws.ID, "api"), store.SecretAAD(other.ID, "db")} {
		if _, err := kr.Open(got.Sealed.KeyID, got.Sealed.Bytes, aad); !errors.Is(err, seal.ErrOpen) {
			t.Errorf("value opened under AAD %q: %v", aad, err)
		}
	}

	list, err := st.ListSecrets(ctx, ws.ID)
	if err != nil || len(list) != 2 || list[0].Name != "api" || list[1].Name != "db" {
		t.Fatalf("ListSecrets = %+v, %v; want api, db", list, err)
	}
	for _, s := range list {
		if s.Sealed.KeyID != "" || len(s.Sealed.Bytes) != 0 || s.WorkspaceID != ws.ID {
			t.Errorf("listed secret %s carries its sealed value or another workspace: %+v", s.Name, s)
		}
	}

	if err := st.DeleteSecret(ctx, ws.ID, "db"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"delete again", st.DeleteSecret(ctx, ws.ID, "db")},
		{"get deleted", func() error { _, err := st.GetSecret(ctx, ws.ID, "db"); return err }()},
		{"delete another workspace's", st.DeleteSecret(ctx, ws.ID, "nope")},
	} {
		if !errors.Is(tc.err, errdefs.ErrNotFound) {
			t.Errorf("%s: %v, want not found", tc.name, tc.err)
		}
	}
	if _, err := st.GetSecret(ctx, other.ID, "db"); err != nil {
		t.Errorf("the other workspace's secret of the same name went too: %v", err)
	}
}

// sealedRows seals one secret, one workspace's storage credentials and the
// agent CA key with kr.
func sealedRows(t *testing.T, st *store.Store, kr *seal.Keyring) (ws store.Workspace) {
	t.Helper()
	ctx := context.Background()
	ws = newWorkspace(t, st)
	putSecret(t, st, kr, ws.ID, "db", "secret-value", "V")
	keyID, sealed, err := kr.Seal([]byte("storage-secret"), store.StorageAAD(ws.ID))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SetStorageCredentials(ctx, ws.ID, store.StoragePublic{Bucket: "b"}, store.Sealed{KeyID: keyID, Bytes: sealed}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetOrCreateCA(ctx, "agents", func() (store.CARow, error) {
		keyID, sealed, err := kr.Seal([]byte("ca-key"), store.CAAAD("agents"))
		return store.CARow{CertPEM: "cert", Key: store.Sealed{KeyID: keyID, Bytes: sealed}}, err
	}); err != nil {
		t.Fatal(err)
	}
	return ws
}

// openAll opens the three rows of sealedRows with kr.
func openAll(t *testing.T, st *store.Store, kr *seal.Keyring, wsID string) []string {
	t.Helper()
	ctx := context.Background()
	sec, err := st.GetSecret(ctx, wsID, "db")
	if err != nil {
		t.Fatal(err)
	}
	_, storage, err := st.GetStorageCredentials(ctx, wsID)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := st.GetOrCreateCA(ctx, "agents", func() (store.CARow, error) { t.Fatal("CA created again"); return store.CARow{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range []struct {
		s   store.Sealed
		aad []byte
	}{{sec.Sealed, store.SecretAAD(wsID, "db")}, {storage, store.StorageAAD(wsID)}, {ca.Key, store.CAAAD("agents")}} {
		pt, err := kr.Open(r.s.KeyID, r.s.Bytes, r.aad)
		if err != nil {
			t.Fatalf("open a row sealed with key %s: %v", r.s.KeyID, err)
		}
		out = append(out, string(pt))
	}
	return out
}

func TestReseal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	want := []string{"secret-value", "storage-secret", "ca-key"}
	for _, tc := range []struct {
		name    string
		keyring *seal.Keyring
		want    store.ResealReport
		// after is the keyring that must open every row afterwards.
		after *seal.Keyring
	}{
		{"nothing to do", keyring(t, keyA), store.ResealReport{AllOnCurrentKey: true}, keyring(t, keyA)},
		{"rotation onto B", keyring(t, keyB, keyA), store.ResealReport{Resealed: 3, AllOnCurrentKey: true}, keyring(t, keyB)},
		{"old key unknown", keyring(t, keyC), store.ResealReport{Stranded: 3}, keyring(t, keyA)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := newStore(t)
			ws := sealedRows(t, st, keyring(t, keyA))
			rep, err := st.Reseal(ctx, tc.keyring)
			if err != nil || rep != tc.want {
				t.Fatalf("Reseal = %+v, %v; want %+v", rep, err, tc.want)
			}
			if got := openAll(t, st, tc.after, ws.ID); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
				t.Errorf("rows open to %q, want %q", got, want)
			}
			// A second pass finds nothing more to move.
			again, err := st.Reseal(ctx, tc.keyring)
			if err != nil || again.Resealed != 0 || again.AllOnCurrentKey != tc.want.AllOnCurrentKey {
				t.Errorf("second Reseal = %+v, %v", again, err)
			}
		})
	}
}
