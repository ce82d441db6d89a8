package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

func TestWorkspaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws := newWorkspace(t, st)

	got, err := st.GetWorkspace(ctx, ws.ID)
	if err != nil || got.Name != ws.Name || !got.CreatedAt.Equal(ws.CreatedAt) || got.HasStorageCredentials {
		t.Fatalf("GetWorkspace = %+v, %v; want %+v", got, err, ws)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"unknown workspace", func() error { _, err := st.GetWorkspace(ctx, "ws_nope"); return err }(), errdefs.ErrNotFound},
		{"duplicate name", st.CreateWorkspace(ctx, store.Workspace{ID: ids.New("ws"), Name: ws.Name, CreatedAt: time.Now()}), errdefs.ErrAlreadyExists},
		{"duplicate id", st.CreateWorkspace(ctx, store.Workspace{ID: ws.ID, Name: "other", CreatedAt: time.Now()}), errdefs.ErrAlreadyExists},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
}

func TestBootstrapOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	attempt := func() (store.Workspace, error) {
		id := ids.New("ws")
		ws := store.Workspace{ID: id, Name: "default-" + id[3:], CreatedAt: time.Now()}
		tokID, _, hash := auth.Mint()
		return ws, st.Bootstrap(ctx, ws, store.Token{ID: tokID, WorkspaceID: ws.ID, Name: "admin", Hash: hash, CreatedAt: time.Now()})
	}
	const n = 8
	var wg sync.WaitGroup
	wins := make(chan store.Workspace, n)
	for range n {
		wg.Go(func() {
			ws, err := attempt()
			switch {
			case err == nil:
				wins <- ws
			case !errors.Is(err, store.ErrBootstrapOver) || !errors.Is(err, errdefs.ErrFailedPrecondition):
				t.Errorf("losing bootstrap: %v, want ErrBootstrapOver", err)
			}
		})
	}
	wg.Wait()
	close(wins)
	if len(wins) != 1 {
		t.Fatalf("%d bootstraps won, want exactly 1", len(wins))
	}
	ws := <-wins
	toks, err := st.ListTokens(ctx, ws.ID, false)
	if err != nil || len(toks) != 1 || toks[0].Name != "admin" {
		t.Errorf("the bootstrapped workspace's tokens = %+v, %v; want its admin token", toks, err)
	}
	if _, err := attempt(); !errors.Is(err, store.ErrBootstrapOver) {
		t.Errorf("bootstrap after the first: %v", err)
	}

	// A workspace created any other way ends bootstrap too.
	st2 := newStore(t)
	newWorkspace(t, st2)
	tokID, _, hash := auth.Mint()
	id := ids.New("ws")
	err = st2.Bootstrap(ctx, store.Workspace{ID: id, Name: "x", CreatedAt: time.Now()}, store.Token{ID: tokID, WorkspaceID: id, Name: "admin", Hash: hash, CreatedAt: time.Now()})
	if !errors.Is(err, store.ErrBootstrapOver) {
		t.Errorf("bootstrap beside an existing workspace: %v", err)
	}
}

func TestStorageCredentials(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws := newWorkspace(t, st)
	kr := keyring(t, keyA)

	if _, _, err := st.GetStorageCredentials(ctx, ws.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("credentials before any are set: %v, want not found", err)
	}
	pub := store.StoragePublic{Endpoint: "s3.example", Bucket: "b", AccessKeyID: "AK", Region: "eu"}
	keyID, sealed, err := kr.Seal([]byte("the-secret-key"), store.StorageAAD(ws.ID))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SetStorageCredentials(ctx, ws.ID, pub, store.Sealed{KeyID: keyID, Bytes: sealed}); err != nil {
		t.Fatal(err)
	}
	gotPub, gotSealed, err := st.GetStorageCredentials(ctx, ws.ID)
	if err != nil || gotPub != pub || gotSealed.KeyID != keyID {
		t.Fatalf("GetStorageCredentials = %+v %+v %v", gotPub, gotSealed, err)
	}
	if pt, err := kr.Open(gotSealed.KeyID, gotSealed.Bytes, store.StorageAAD(ws.ID)); err != nil || string(pt) != "the-secret-key" {
		t.Errorf("stored credentials open to %q, %v", pt, err)
	}
	if w, _ := st.GetWorkspace(ctx, ws.ID); !w.HasStorageCredentials {
		t.Error("workspace does not say it has storage credentials")
	}
	if err := st.SetStorageCredentials(ctx, "ws_nope", pub, store.Sealed{KeyID: keyID, Bytes: sealed}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("credentials of an unknown workspace: %v, want not found", err)
	}
}
