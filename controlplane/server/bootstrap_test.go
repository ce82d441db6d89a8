package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

func TestBootstrapGRPC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("off without a configured secret", func(t *testing.T) {
		t.Parallel()
		cfg := env.Config(t)
		cfg.Controlplane.Auth.BootstrapSecret = ""
		in := controlplanetest.Start(t, cfg, true)
		_, err := v1.NewAuthServiceClient(in.Conn).Authorize(withBootstrap(ctx, "anything"), &v1.AuthorizeRequest{})
		wantCode(t, "bootstrap off", err, codes.FailedPrecondition)
		if err == nil || !strings.Contains(err.Error(), "Bootstrap is off on this controlplane") {
			t.Errorf("message = %v", err)
		}
	})

	t.Run("missing, wrong, right, then over", func(t *testing.T) {
		t.Parallel()
		in := controlplanetest.Start(t, env.Config(t), true)
		ac := v1.NewAuthServiceClient(in.Conn)
		_, err := ac.Authorize(ctx, &v1.AuthorizeRequest{})
		wantCode(t, "no secret", err, codes.Unauthenticated)
		_, err = ac.Authorize(withBootstrap(ctx, "wrong-secret"), &v1.AuthorizeRequest{})
		wantCode(t, "wrong secret", err, codes.PermissionDenied)

		resp := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
		if !resp.Bootstrapped || resp.Token == "" || resp.WorkspaceName != "default" {
			t.Fatalf("bootstrap response = %+v", resp)
		}
		// The token works, and Authorize with it names the workspace.
		who, err := ac.Authorize(withToken(ctx, resp.Token), &v1.AuthorizeRequest{})
		if err != nil || who.WorkspaceId != resp.WorkspaceId || who.Token != "" {
			t.Fatalf("authorize with token = %+v, %v", who, err)
		}
		// Once a workspace exists the secret does nothing.
		_, err = ac.Authorize(withBootstrap(ctx, "test-bootstrap-secret-0123456789abcdef"), &v1.AuthorizeRequest{})
		wantCode(t, "second bootstrap", err, codes.FailedPrecondition)
		if strings.Contains(in.Logs.String(), "test-bootstrap-secret-0123456789abcdef") || strings.Contains(in.Logs.String(), resp.Token) {
			t.Error("a secret reached the logs")
		}
	})

	t.Run("concurrent calls make one workspace", func(t *testing.T) {
		t.Parallel()
		in := controlplanetest.Start(t, env.Config(t), true)
		ac := v1.NewAuthServiceClient(in.Conn)
		const n = 12
		var wg sync.WaitGroup
		results := make(chan error, n)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := ac.Authorize(withBootstrap(ctx, "test-bootstrap-secret-0123456789abcdef"), &v1.AuthorizeRequest{})
				results <- err
			}()
		}
		wg.Wait()
		close(results)
		ok := 0
		for err := range results {
			if err == nil {
				ok++
			} else {
				wantCode(t, "losing bootstrap", err, codes.FailedPrecondition)
			}
		}
		if ok != 1 {
			t.Fatalf("%d bootstraps succeeded, want exactly 1", ok)
		}
	})
}

func restAuthorize(t *testing.T, restAddr, secret, token string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+restAddr+"/api/v1/controlplane/auth/authorize", strings.NewReader(`{}`))
	if secret != "" {
		req.Header.Set("Grpc-Metadata-X-Levers9-Bootstrap-Secret", secret)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m
}

func TestBootstrapREST(t *testing.T) {
	t.Parallel()
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		cfg := env.Config(t)
		cfg.Controlplane.Auth.BootstrapSecret = ""
		in := controlplanetest.Start(t, cfg, true)
		code, body := restAuthorize(t, in.Server.RESTAddr(), "x", "")
		if code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(body["message"]), "Bootstrap is off on this controlplane") {
			t.Errorf("off: %d %v", code, body)
		}
	})
	t.Run("rules", func(t *testing.T) {
		t.Parallel()
		in := controlplanetest.Start(t, env.Config(t), true)
		addr := in.Server.RESTAddr()
		if code, body := restAuthorize(t, addr, "", ""); code != http.StatusUnauthorized {
			t.Errorf("missing secret: %d %v", code, body)
		}
		if code, body := restAuthorize(t, addr, "nope", ""); code != http.StatusForbidden {
			t.Errorf("wrong secret: %d %v", code, body)
		}
		code, body := restAuthorize(t, addr, "test-bootstrap-secret-0123456789abcdef", "")
		if code != http.StatusOK || body["token"] == nil || body["bootstrapped"] != true {
			t.Fatalf("right secret: %d %v", code, body)
		}
		tok := body["token"].(string)
		if code, body := restAuthorize(t, addr, "test-bootstrap-secret-0123456789abcdef", ""); code != http.StatusBadRequest {
			t.Errorf("after a workspace exists: %d %v", code, body)
		}
		if code, body := restAuthorize(t, addr, "", tok); code != http.StatusOK || body["workspaceId"] == nil {
			t.Errorf("token over REST: %d %v", code, body)
		}
		// Other REST routes need the token too.
		req, _ := http.NewRequest("GET", "http://"+addr+"/api/v1/tokens", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("tokens without a token: %d", resp.StatusCode)
		}
	})
}
