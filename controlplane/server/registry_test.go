package server_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/controlplane/store"
)

// TestRegistryLogins: a workspace's registry logins are sealed, listed as
// hosts and usernames only (gRPC and REST), invisible to another workspace,
// and bad input is refused naming the field without echoing the password.
func TestRegistryLogins(t *testing.T) {
	t.Parallel()
	cfg := env.Config(t)
	in := controlplanetest.Start(t, cfg, true)
	a := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
	_, bTok := secondWorkspace(t, in, "other")
	ctxA := withToken(context.Background(), a.Token)
	ctxB := withToken(context.Background(), bTok)
	rc := v1.NewRegistryServiceClient(in.Conn)
	const password = "reg-pw-0c4f1e9a7b"

	for _, tc := range []struct {
		name  string
		req   *v1.LoginRegistryRequest
		field string
	}{
		{"scheme", &v1.LoginRegistryRequest{Host: "https://reg.example", Username: "u", Password: password}, "host"},
		{"path", &v1.LoginRegistryRequest{Host: "reg.example/team", Username: "u", Password: password}, "host"},
		{"empty host", &v1.LoginRegistryRequest{Username: "u", Password: password}, "host"},
		{"no username", &v1.LoginRegistryRequest{Host: "reg.example", Password: password}, "username"},
		{"no password", &v1.LoginRegistryRequest{Host: "reg.example", Username: "u"}, "password"},
		{"line break", &v1.LoginRegistryRequest{Host: "reg.example", Username: "u", Password: password + "\nx"}, "password"},
	} {
		_, err := rc.LoginRegistry(ctxA, tc.req)
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(msg, tc.field) || strings.Contains(msg, password) {
			t.Errorf("%s: %v, want InvalidArgument naming %s without the password", tc.name, err, tc.field)
		}
	}

	resp, err := rc.LoginRegistry(ctxA, &v1.LoginRegistryRequest{Host: "reg.example:5000", Username: "ci", Password: password})
	if err != nil || resp.Credential.Host != "reg.example:5000" || resp.Credential.Username != "ci" {
		t.Fatalf("login: %v %v", resp, err)
	}
	// docker.io is index.docker.io, as image references resolve it.
	if resp, err := rc.LoginRegistry(ctxA, &v1.LoginRegistryRequest{Host: "docker.io", Username: "hub", Password: password}); err != nil ||
		resp.Credential.Host != "index.docker.io" {
		t.Fatalf("login docker.io: %v %v", resp, err)
	}
	list, err := rc.ListRegistryCredentials(ctxA, &v1.ListRegistryCredentialsRequest{})
	if err != nil || len(list.Credentials) != 2 || list.Credentials[1].Host != "reg.example:5000" {
		t.Fatalf("list: %v %v", list, err)
	}

	t.Run("REST", func(t *testing.T) {
		base := "http://" + in.Server.RESTAddr() + "/api/v1/registries"
		do := func(method, url, body string) (int, string) {
			req, _ := http.NewRequest(method, url, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+a.Token)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			return res.StatusCode, string(b)
		}
		if code, body := do("PUT", base+"/rest.example:443", `{"username":"r","password":"`+password+`"}`); code != 200 || strings.Contains(body, password) {
			t.Errorf("PUT: %d %s", code, body)
		}
		code, body := do("GET", base, "")
		if code != 200 || !strings.Contains(body, `"host":"rest.example:443"`) || strings.Contains(body, password) {
			t.Errorf("GET: %d %s", code, body)
		}
		if code, body := do("DELETE", base+"/rest.example:443", ""); code != 200 {
			t.Errorf("DELETE: %d %s", code, body)
		}
	})

	t.Run("other workspace", func(t *testing.T) {
		list, err := rc.ListRegistryCredentials(ctxB, &v1.ListRegistryCredentialsRequest{})
		if err != nil || len(list.Credentials) != 0 {
			t.Errorf("B lists %v %v", list, err)
		}
		_, err = rc.LogoutRegistry(ctxB, &v1.LogoutRegistryRequest{Host: "reg.example:5000"})
		wantCode(t, "B logs A out", err, codes.NotFound)
	})

	t.Run("sealed at rest", func(t *testing.T) {
		st, err := store.Open(context.Background(), cfg.Database.Postgres.ConnString(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		c, err := st.GetRegistryCredential(context.Background(), a.WorkspaceId, "reg.example:5000")
		if err != nil || c.Username != "ci" || len(c.Sealed.Bytes) == 0 || bytes.Contains(c.Sealed.Bytes, []byte(password)) {
			t.Errorf("row: %+v %v", c, err)
		}
	})

	if _, err := rc.LogoutRegistry(ctxA, &v1.LogoutRegistryRequest{Host: "reg.example:5000"}); err != nil {
		t.Fatal(err)
	}
	_, err = rc.LogoutRegistry(ctxA, &v1.LogoutRegistryRequest{Host: "reg.example:5000"})
	wantCode(t, "second logout", err, codes.NotFound)
	if strings.Contains(in.Logs.String(), password) {
		t.Error("the controlplane's log holds the password")
	}
}
