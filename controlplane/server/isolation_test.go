package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/ids"
)

// secondWorkspace seeds another workspace with an admin token straight
// into the store (there is no API to create workspaces yet).
func secondWorkspace(t *testing.T, in *controlplanetest.Instance, name string) (wsID, token string) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, in.Config.Database.Postgres.ConnString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ws := store.Workspace{ID: ids.New("ws"), Name: name, CreatedAt: time.Now()}
	if err := st.CreateWorkspace(ctx, ws); err != nil {
		t.Fatal(err)
	}
	id, tok, hash := auth.Mint()
	if err := st.CreateToken(ctx, store.Token{ID: id, WorkspaceID: ws.ID, Name: "admin", Role: store.RoleAdmin, Hash: hash, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return ws.ID, tok
}

func TestCrossWorkspaceAccessDenied(t *testing.T) {
	t.Parallel()
	in := controlplanetest.Start(t, env.Config(t), true)
	a := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
	bWS, bTok := secondWorkspace(t, in, "other")
	ctxA := withToken(context.Background(), a.Token)
	ctxB := withToken(context.Background(), bTok)
	tokens := v1.NewTokenServiceClient(in.Conn)
	secrets := v1.NewSecretServiceClient(in.Conn)
	workspaces := v1.NewWorkspaceServiceClient(in.Conn)

	// B's objects of every kind.
	bTokResp, err := tokens.CreateToken(ctxB, &v1.CreateTokenRequest{Name: "b-ci", Role: v1.Role_ROLE_ADMIN})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.PutSecret(ctxB, &v1.PutSecretRequest{Name: "db", Values: map[string]string{"PASSWORD": "b-value"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := workspaces.SetStorageCredentials(ctxB, &v1.SetStorageCredentialsRequest{Credentials: &v1.StorageCredentials{
		Endpoint: "s3.example", Bucket: "b", AccessKeyId: "AKB", SecretAccessKey: "b-secret"}}); err != nil {
		t.Fatal(err)
	}

	t.Run("tokens", func(t *testing.T) {
		list, err := tokens.ListTokens(ctxA, &v1.ListTokensRequest{IncludeRevoked: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range list.Tokens {
			if tk.WorkspaceId != a.WorkspaceId {
				t.Errorf("A sees token %s of workspace %s", tk.Id, tk.WorkspaceId)
			}
		}
		_, err = tokens.RevokeToken(ctxA, &v1.RevokeTokenRequest{Id: bTokResp.Token.Id})
		wantCode(t, "A revokes B's token", err, codes.NotFound)
		// B's token still works.
		if _, err := tokens.ListTokens(withToken(context.Background(), bTokResp.Secret), &v1.ListTokensRequest{}); err != nil {
			t.Errorf("B's token stopped working: %v", err)
		}
	})
	t.Run("secrets", func(t *testing.T) {
		list, err := secrets.ListSecrets(ctxA, &v1.ListSecretsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Secrets) != 0 {
			t.Errorf("A sees %d secrets of B", len(list.Secrets))
		}
		_, err = secrets.DeleteSecret(ctxA, &v1.DeleteSecretRequest{Name: "db"})
		wantCode(t, "A deletes B's secret", err, codes.NotFound)
		// A's own secret of the same name is a different object.
		if _, err := secrets.PutSecret(ctxA, &v1.PutSecretRequest{Name: "db", Values: map[string]string{"PASSWORD": "a-value"}}); err != nil {
			t.Fatal(err)
		}
		bl, err := secrets.ListSecrets(ctxB, &v1.ListSecretsRequest{})
		if err != nil || len(bl.Secrets) != 1 || bl.Secrets[0].WorkspaceId != bWS {
			t.Errorf("B's secrets after A's put: %v %v", bl, err)
		}
	})
	t.Run("workspace and storage", func(t *testing.T) {
		w, err := workspaces.GetWorkspace(ctxA, &v1.GetWorkspaceRequest{})
		if err != nil || w.Workspace.Id != a.WorkspaceId || w.Workspace.HasStorageCredentials {
			t.Errorf("A's workspace = %v %v", w, err)
		}
		_, err = workspaces.GetStorageCredentials(ctxA, &v1.GetStorageCredentialsRequest{})
		wantCode(t, "A reads storage credentials (only B has some)", err, codes.NotFound)
		got, err := workspaces.GetStorageCredentials(ctxB, &v1.GetStorageCredentialsRequest{})
		if err != nil || got.Credentials.AccessKeyId != "AKB" || got.Credentials.SecretAccessKey != "" {
			t.Errorf("B's own credentials = %v %v (secret must stay write-only)", got, err)
		}
	})
	t.Run("rest", func(t *testing.T) {
		req, _ := http.NewRequest("DELETE", "http://"+in.Server.RESTAddr()+"/api/v1/tokens/"+bTokResp.Token.Id+"/revoke", nil)
		req.Method = "POST"
		req.Header.Set("Authorization", "Bearer "+a.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("REST revoke of B's token by A: %d, want 404", resp.StatusCode)
		}
	})
}

func TestTokens(t *testing.T) {
	t.Parallel()
	in := controlplanetest.Start(t, env.Config(t), true)
	a := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
	ctx := withToken(context.Background(), a.Token)
	tokens := v1.NewTokenServiceClient(in.Conn)

	created, err := tokens.CreateToken(ctx, &v1.CreateTokenRequest{Name: "ci", Role: v1.Role_ROLE_ADMIN})
	if err != nil {
		t.Fatal(err)
	}
	ctxNew := withToken(context.Background(), created.Secret)
	if _, err := tokens.ListTokens(ctxNew, &v1.ListTokensRequest{}); err != nil {
		t.Fatalf("new token: %v", err)
	}
	used, err := tokens.ListTokens(ctx, &v1.ListTokensRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range used.Tokens {
		if tk.Id == created.Token.Id && tk.LastUsedAt == nil {
			t.Error("a used token has no last_used_at")
		}
	}
	if _, err := tokens.RevokeToken(ctx, &v1.RevokeTokenRequest{Id: created.Token.Id}); err != nil {
		t.Fatal(err)
	}
	_, err = tokens.ListTokens(ctxNew, &v1.ListTokensRequest{})
	wantCode(t, "revoked token", err, codes.Unauthenticated)

	list, err := tokens.ListTokens(ctx, &v1.ListTokensRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range list.Tokens {
		if tk.Id == created.Token.Id {
			t.Error("revoked token listed without include_revoked")
		}
	}
	_, err = tokens.ListTokens(context.Background(), &v1.ListTokensRequest{})
	wantCode(t, "no token", err, codes.Unauthenticated)
	_, err = tokens.ListTokens(withToken(context.Background(), "garbage"), &v1.ListTokensRequest{})
	wantCode(t, "malformed token", err, codes.Unauthenticated)
	// A well-formed token whose secret is wrong.
	forged := a.Token[:len(a.Token)-4] + "aaaa"
	if forged == a.Token {
		forged = a.Token[:len(a.Token)-4] + "bbbb"
	}
	_, err = tokens.ListTokens(withToken(context.Background(), forged), &v1.ListTokensRequest{})
	wantCode(t, "forged token", err, codes.Unauthenticated)
	_, err = tokens.CreateToken(ctx, &v1.CreateTokenRequest{Name: "bad name!"})
	wantCode(t, "bad name", err, codes.InvalidArgument)
}
