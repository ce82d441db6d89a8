package store_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
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
			{"duplicate id", store.Token{ID: older.ID, WorkspaceID: ws.ID, Name: "x", Role: store.RoleAdmin, Hash: []byte{1}, CreatedAt: base}, errdefs.ErrAlreadyExists},
			{"unknown workspace", store.Token{ID: "tok_x", WorkspaceID: "ws_nope", Name: "x", Role: store.RoleAdmin, Hash: []byte{1}, CreatedAt: base}, errdefs.ErrInvalidArgument},
		} {
			if err := st.CreateToken(ctx, tc.tok); !errors.Is(err, tc.want) {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			}
		}
	})
}

func TestTokenRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws := newWorkspace(t, st)

	t.Run("each role round-trips", func(t *testing.T) {
		for _, r := range store.Roles() {
			id, _, hash := auth.Mint()
			if err := st.CreateToken(ctx, store.Token{ID: id, WorkspaceID: ws.ID, Name: "x", Role: r, Hash: hash, CreatedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
			if got, err := st.UseToken(ctx, id); err != nil || got.Role != r {
				t.Errorf("role %s came back as %q (%v)", r, got.Role, err)
			}
		}
	})
	t.Run("a token without a known role is refused", func(t *testing.T) {
		for _, r := range []store.Role{"", "root", "Admin"} {
			id, _, hash := auth.Mint()
			err := st.CreateToken(ctx, store.Token{ID: id, WorkspaceID: ws.ID, Name: "x", Role: r, Hash: hash, CreatedAt: time.Now()})
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "role") {
				t.Errorf("role %q: %v, want an invalid argument naming the role", r, err)
			}
		}
		// Postgres refuses it too, whatever query writes it.
		tok, _ := newToken(t, st, ws.ID, time.Now())
		for _, q := range []string{
			`UPDATE tokens SET role = 'root' WHERE id = '` + tok.ID + `' RETURNING id`,
			`INSERT INTO tokens (id, workspace_id, name, hash) VALUES ('tok_norole', '` + ws.ID + `', 'x', '\x01') RETURNING id`,
		} {
			if _, err := st.QueryStringsForTest(ctx, q); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s: %v, want a refused write", q, err)
			}
		}
	})
	t.Run("the bootstrap token is admin", func(t *testing.T) {
		st := newStore(t)
		id, _, hash := auth.Mint()
		wsID := ids.New("ws")
		if err := st.Bootstrap(ctx, store.Workspace{ID: wsID, Name: "first", CreatedAt: time.Now()},
			store.Token{ID: id, WorkspaceID: wsID, Name: "admin", Role: store.RoleMember, Hash: hash, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if got, err := st.UseToken(ctx, id); err != nil || got.Role != store.RoleAdmin {
			t.Errorf("bootstrap token role %q (%v), want admin", got.Role, err)
		}
	})
}

// Tokens made before roles existed become admin: the migration's Up, run
// on a tokens table as it was before it, against real Postgres.
func TestRoleMigrationMakesOldTokensAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws := newWorkspace(t, st)
	sql, err := os.ReadFile("migrations/00005_token_roles.sql")
	if err != nil {
		t.Fatal(err)
	}
	up, down, ok := strings.Cut(string(sql), "-- +goose Down")
	if !ok {
		t.Fatal("no -- +goose Down in the migration")
	}
	exec := func(script string) {
		t.Helper()
		for _, stmt := range statements(script) {
			if _, err := st.QueryStringsForTest(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
	}
	exec(down)
	if _, err := st.QueryStringsForTest(ctx, `INSERT INTO tokens (id, workspace_id, name, hash) VALUES ('tok_old', '`+ws.ID+`', 'ci', '\x01')`); err != nil {
		t.Fatal(err)
	}
	exec(up)
	if got, err := st.UseToken(ctx, "tok_old"); err != nil || got.Role != store.RoleAdmin {
		t.Errorf("a token from before roles has role %q (%v), want admin", got.Role, err)
	}
}

// statements splits a migration script into its statements, without
// comments.
func statements(script string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.SplitSeq(script, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		cur.WriteString(line + "\n")
		if strings.HasSuffix(strings.TrimSpace(line), ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	return out
}
