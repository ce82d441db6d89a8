package api_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/api"
	"github.com/levers9/levers9/controlplane/auth"
)

func TestTokenService(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := &api.TokenService{Deps: b.deps}

	created, err := s.CreateToken(b.ctx, &v1.CreateTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if created.Token.Name != "token" || created.Token.WorkspaceId != b.ws.ID || created.Secret == "" || created.Token.Revoked {
		t.Errorf("CreateToken = %+v", created)
	}
	pt, err := auth.ParseToken(created.Secret)
	if err != nil || pt.ID != created.Token.Id {
		t.Errorf("the secret does not parse to the token's ID: %v", err)
	}
	list, err := s.ListTokens(b.ctx, &v1.ListTokensRequest{})
	if err != nil || len(list.Tokens) != 1 || list.Tokens[0].Id != created.Token.Id {
		t.Fatalf("ListTokens = %v, %v", list, err)
	}

	_, err = s.RevokeToken(b.ctx, &v1.RevokeTokenRequest{})
	wantCode(t, "revoke without an id", err, codes.InvalidArgument)
	_, err = s.RevokeToken(b.ctx, &v1.RevokeTokenRequest{Id: "tok_nope"})
	wantCode(t, "revoke an unknown token", err, codes.NotFound)
	first, err := s.RevokeToken(b.ctx, &v1.RevokeTokenRequest{Id: created.Token.Id})
	if err != nil || !first.Token.Revoked || first.Token.RevokedAt == nil {
		t.Fatalf("RevokeToken = %v, %v", first, err)
	}
	again, err := s.RevokeToken(b.ctx, &v1.RevokeTokenRequest{Id: created.Token.Id})
	if err != nil || !again.Token.RevokedAt.AsTime().Equal(first.Token.RevokedAt.AsTime()) {
		t.Errorf("a second revoke = %v, %v; want the first time kept", again, err)
	}
	for _, tc := range []struct {
		includeRevoked bool
		want           int
	}{{false, 0}, {true, 1}} {
		list, err := s.ListTokens(b.ctx, &v1.ListTokensRequest{IncludeRevoked: tc.includeRevoked})
		if err != nil || len(list.Tokens) != tc.want {
			t.Errorf("ListTokens(include_revoked=%v) = %d tokens, %v; want %d", tc.includeRevoked, len(list.Tokens), err, tc.want)
		}
	}

	b.noSecrets(t, []proto.Message{list, first, again}, created.Secret)
	if got := strings.Join(b.events(t, created.Secret), " "); got != "token.created token.revoked token.revoked" {
		t.Errorf("events = %s", got)
	}
	for name, call := range map[string]func(context.Context) error{
		"create": func(ctx context.Context) error { _, err := s.CreateToken(ctx, &v1.CreateTokenRequest{}); return err },
		"list":   func(ctx context.Context) error { _, err := s.ListTokens(ctx, &v1.ListTokensRequest{}); return err },
		"revoke": func(ctx context.Context) error {
			_, err := s.RevokeToken(ctx, &v1.RevokeTokenRequest{Id: created.Token.Id})
			return err
		},
	} {
		wantCode(t, name+" without a caller", call(context.Background()), codes.Unauthenticated)
	}
}

func TestSecretService(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := &api.SecretService{Deps: b.deps}
	const v1Secret, v2Secret = "first-value-never-returned", "second-value-never-returned"

	put, err := s.PutSecret(b.ctx, &v1.PutSecretRequest{Name: "db", Values: map[string]string{"USER": "admin", "PASSWORD": v1Secret}})
	if err != nil {
		t.Fatal(err)
	}
	if put.Secret.Name != "db" || strings.Join(put.Secret.Keys, ",") != "PASSWORD,USER" {
		t.Errorf("PutSecret = %+v; want keys sorted", put.Secret)
	}
	replaced, err := s.PutSecret(b.ctx, &v1.PutSecretRequest{Name: "db", Values: map[string]string{"PASSWORD": v2Secret}})
	if err != nil || replaced.Secret.Id != put.Secret.Id || strings.Join(replaced.Secret.Keys, ",") != "PASSWORD" {
		t.Errorf("replace = %+v, %v", replaced, err)
	}
	vals, err := b.deps.OpenSecret(context.Background(), b.ws.ID, "db")
	if err != nil || len(vals) != 1 || vals["PASSWORD"] != v2Secret {
		t.Errorf("OpenSecret = %v, %v; want the replaced value", vals, err)
	}
	list, err := s.ListSecrets(b.ctx, &v1.ListSecretsRequest{})
	if err != nil || len(list.Secrets) != 1 {
		t.Fatalf("ListSecrets = %v, %v", list, err)
	}
	// The stored row holds the value sealed, not in the clear.
	row, err := b.deps.Store.GetSecret(context.Background(), b.ws.ID, "db")
	if err != nil || strings.Contains(string(row.Sealed.Bytes), v2Secret) {
		t.Errorf("stored secret is not sealed (%v)", err)
	}

	big := strings.Repeat("x", 64<<10)
	for _, tc := range []struct {
		name string
		req  *v1.PutSecretRequest
	}{
		{"bad name", &v1.PutSecretRequest{Name: "no spaces", Values: map[string]string{"K": "v"}}},
		{"no values", &v1.PutSecretRequest{Name: "empty"}},
		{"bad key", &v1.PutSecretRequest{Name: "x", Values: map[string]string{"K=V": "v"}}},
		{"too large", &v1.PutSecretRequest{Name: "x", Values: map[string]string{"K": big}}},
	} {
		_, err := s.PutSecret(b.ctx, tc.req)
		wantCode(t, tc.name, err, codes.InvalidArgument)
	}

	if _, err := s.DeleteSecret(b.ctx, &v1.DeleteSecretRequest{Name: "db"}); err != nil {
		t.Fatal(err)
	}
	_, err = s.DeleteSecret(b.ctx, &v1.DeleteSecretRequest{Name: "db"})
	wantCode(t, "delete twice", err, codes.NotFound)
	if _, err := b.deps.OpenSecret(context.Background(), b.ws.ID, "db"); err == nil {
		t.Error("a deleted secret still opens")
	}

	b.noSecrets(t, []proto.Message{put, replaced, list}, v1Secret, v2Secret)
	if got := strings.Join(b.events(t, v1Secret, v2Secret), " "); got != "secret.put secret.put secret.deleted" {
		t.Errorf("events = %s", got)
	}
	_, err = s.ListSecrets(context.Background(), &v1.ListSecretsRequest{})
	wantCode(t, "list without a caller", err, codes.Unauthenticated)
}

func TestStorageCredentialsService(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := &api.WorkspaceService{Deps: b.deps}
	const secret = "storage-secret-never-returned"

	_, err := s.GetStorageCredentials(b.ctx, &v1.GetStorageCredentialsRequest{})
	wantCode(t, "get before set", err, codes.NotFound)
	// Every missing field is named at once.
	_, err = s.SetStorageCredentials(b.ctx, &v1.SetStorageCredentialsRequest{Credentials: &v1.StorageCredentials{Bucket: "b"}})
	wantCode(t, "missing fields", err, codes.InvalidArgument)
	for _, f := range []string{"credentials.endpoint", "credentials.access_key_id", "credentials.secret_access_key"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("the error does not name %s: %v", f, err)
		}
	}
	set, err := s.SetStorageCredentials(b.ctx, &v1.SetStorageCredentialsRequest{Credentials: &v1.StorageCredentials{
		Endpoint: "s3.example", Bucket: "b", AccessKeyId: "AK", SecretAccessKey: secret, Region: "eu"}})
	if err != nil || !set.Workspace.HasStorageCredentials {
		t.Fatalf("SetStorageCredentials = %v, %v", set, err)
	}
	got, err := s.GetStorageCredentials(b.ctx, &v1.GetStorageCredentialsRequest{})
	if err != nil || got.Credentials.Endpoint != "s3.example" || got.Credentials.Region != "eu" || got.Credentials.SecretAccessKey != "" {
		t.Errorf("GetStorageCredentials = %v, %v", got, err)
	}
	b.noSecrets(t, []proto.Message{set, got}, secret)
	b.events(t, secret)
}

func TestBootstrapOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Bootstrap needs a database without workspaces.
	st, _ := env.NewStore(t)
	b.deps.Store = st
	b.deps.BootstrapSecret = "the-bootstrap-secret"
	s := &api.AuthService{Deps: b.deps, Auth: &auth.Authenticator{Store: st}}
	withSecret := metadata.NewIncomingContext(context.Background(), metadata.Pairs(auth.BootstrapHeader, "the-bootstrap-secret"))

	_, err := s.Authorize(withSecret, &v1.AuthorizeRequest{WorkspaceName: "bad name!"})
	wantCode(t, "a bad workspace name", err, codes.InvalidArgument)
	resp, err := s.Authorize(withSecret, &v1.AuthorizeRequest{WorkspaceName: "team-a"})
	if err != nil || !resp.Bootstrapped || resp.WorkspaceName != "team-a" || resp.Token == "" {
		t.Fatalf("bootstrap after a refused one = %+v, %v", resp, err)
	}
	_, err = s.Authorize(withSecret, &v1.AuthorizeRequest{WorkspaceName: "team-b"})
	wantCode(t, "a second bootstrap", err, codes.FailedPrecondition)
	if ws, err := st.GetWorkspace(context.Background(), resp.WorkspaceId); err != nil || ws.Name != "team-a" {
		t.Errorf("the bootstrapped workspace = %+v, %v", ws, err)
	}
	toks, err := st.ListTokens(context.Background(), resp.WorkspaceId, true)
	if err != nil || len(toks) != 1 || toks[0].ID != resp.TokenId || toks[0].Name != "admin" {
		t.Errorf("tokens after bootstrap = %+v, %v; want one admin token", toks, err)
	}
	withToken := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+resp.Token))
	who, err := s.Authorize(withToken, &v1.AuthorizeRequest{})
	if err != nil || who.WorkspaceId != resp.WorkspaceId || who.Bootstrapped || who.Token != "" {
		t.Errorf("Authorize with the admin token = %+v, %v", who, err)
	}
	b.noSecrets(t, []proto.Message{who}, resp.Token, "the-bootstrap-secret")
	if got := strings.Join(b.events(t, resp.Token), " "); got != "workspace.bootstrapped" {
		t.Errorf("events = %s", got)
	}
}
