package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

func TestTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws, other := newWorkspace(t, st), newWorkspace(t, st)
	base := time.Now().UTC().Truncate(time.Second)
	older, _ := newToken(t, st, ws.ID, base.Add(-time.Hour))
	newer, _ := newToken(t, st, ws.ID, base)
	theirs, _ := newToken(t, st, other.ID, base)

	t.Run("use records last use at most once a minute", func(t *testing.T) {
		got, err := st.UseToken(ctx, older.ID)
		if err != nil || got.WorkspaceID != ws.ID || string(got.Hash) != string(older.Hash) {
			t.Fatalf("UseToken = %+v, %v", got, err)
		}
		first, err := st.UseToken(ctx, older.ID)
		if err != nil || first.LastUsedAt == nil {
			t.Fatalf("after a use: %+v, %v", first, err)
		}
		again, err := st.UseToken(ctx, older.ID)
		if err != nil || !again.LastUsedAt.Equal(*first.LastUsedAt) {
			t.Errorf("a second use within the minute moved last_used_at: %v -> %v (%v)", first.LastUsedAt, again.LastUsedAt, err)
		}
		if _, err := st.UseToken(ctx, "tok_nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("unknown token: %v", err)
		}
	})
	t.Run("list newest first, own workspace only", func(t *testing.T) {
		list, err := st.ListTokens(ctx, ws.ID, false)
		if err != nil || len(list) != 2 || list[0].ID != newer.ID || list[1].ID != older.ID {
			t.Fatalf("ListTokens = %+v, %v; want %s then %s", list, err, newer.ID, older.ID)
		}
	})
	t.Run("revoke", func(t *testing.T) {
		first, err := st.RevokeToken(ctx, ws.ID, newer.ID)
		if err != nil || first.RevokedAt == nil {
			t.Fatalf("RevokeToken = %+v, %v", first, err)
		}
		again, err := st.RevokeToken(ctx, ws.ID, newer.ID)
		if err != nil || !again.RevokedAt.Equal(*first.RevokedAt) {
			t.Errorf("a second revoke moved revoked_at: %v -> %v (%v)", first.RevokedAt, again.RevokedAt, err)
		}
		if _, err := st.RevokeToken(ctx, ws.ID, theirs.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("revoking another workspace's token: %v, want not found", err)
		}
		if got, _ := st.UseToken(ctx, theirs.ID); got.RevokedAt != nil {
			t.Error("another workspace's token was revoked")
		}
		for _, tc := range []struct {
			includeRevoked bool
			want           int
		}{{false, 1}, {true, 2}} {
			list, err := st.ListTokens(ctx, ws.ID, tc.includeRevoked)
			if err != nil || len(list) != tc.want {
				t.Errorf("ListTokens(includeRevoked=%v) = %d tokens (%v), want %d", tc.includeRevoked, len(list), err, tc.want)
			}
		}
	})
	t.Run("bad rows", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			tok  store.Token
			want error
		}{
			{"duplicate id", store.Token{ID: older.ID, WorkspaceID: ws.ID, Name: "x", Hash: []byte{1}, CreatedAt: base}, errdefs.ErrAlreadyExists},
			{"unknown workspace", store.Token{ID: "tok_x", WorkspaceID: "ws_nope", Name: "x", Hash: []byte{1}, CreatedAt: base}, errdefs.ErrInvalidArgument},
		} {
			if err := st.CreateToken(ctx, tc.tok); !errors.Is(err, tc.want) {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			}
		}
	})
}
