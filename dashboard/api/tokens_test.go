package api

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

func TestTokenCreateRevoke(t *testing.T) {
	b := setup(t, setupOpts{})
	br := b.signedIn(t, testAdmin)
	var created struct {
		Token  tokenJSON `json:"token"`
		Secret string    `json:"secret"`
	}
	if code := br.call("POST", "/api/tokens", map[string]string{"name": "laptop", "role": "member"}, &created); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	if created.Secret == "" || created.Token.Name != "laptop" || created.Token.Role != "member" || created.Token.Revoked {
		t.Fatalf("created: %+v", created.Token)
	}
	// The secret is a working member token of the workspace.
	withNew := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+created.Secret)
	tasks := v1.NewTaskServiceClient(b.cp.Conn)
	if _, err := tasks.ListTasks(withNew, &v1.ListTasksRequest{}); err != nil {
		t.Fatalf("the new token does not work: %v", err)
	}
	// Listed by role, and never with its secret again.
	resp := br.do("GET", "/api/tokens", nil, nil)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(raw), created.Secret) {
		t.Error("GET /api/tokens shows a token's secret")
	}
	var list struct {
		Tokens []tokenJSON            `json:"tokens"`
		ByRole map[string][]tokenJSON `json:"byRole"`
	}
	if code := br.call("GET", "/api/tokens", nil, &list); code != http.StatusOK {
		t.Fatalf("list: %d", code)
	}
	if len(list.ByRole["member"]) != 1 || list.ByRole["member"][0].ID != created.Token.ID || len(list.ByRole["admin"]) != 1 {
		t.Errorf("by role: %+v", list.ByRole)
	}

	var revoked struct {
		Token tokenJSON `json:"token"`
	}
	if code := br.call("DELETE", "/api/tokens/"+created.Token.ID, nil, &revoked); code != http.StatusOK || !revoked.Token.Revoked {
		t.Fatalf("revoke: %d %+v", code, revoked)
	}
	if _, err := tasks.ListTasks(withNew, &v1.ListTasksRequest{}); err == nil {
		t.Error("a revoked token still works")
	}
	if code := br.call("GET", "/api/tokens", nil, &list); code != http.StatusOK || len(list.ByRole["member"]) != 0 {
		t.Errorf("revoked token still listed without includeRevoked: %+v", list.ByRole)
	}
	if code := br.call("GET", "/api/tokens?includeRevoked=true", nil, &list); code != http.StatusOK || len(list.ByRole["member"]) != 1 {
		t.Errorf("includeRevoked: %+v", list.ByRole)
	}
	var e apiError
	if code := br.call("POST", "/api/tokens", map[string]string{"name": "x", "role": "root"}, &e); code != http.StatusBadRequest {
		t.Errorf("bad role: %d %+v", code, e)
	}
}

func TestSecretsShowNamesOnly(t *testing.T) {
	b := setup(t, setupOpts{})
	const value = "hunter2-never-shown"
	if _, err := v1.NewSecretServiceClient(b.cp.Conn).PutSecret(b.admin, &v1.PutSecretRequest{Name: "db", Values: map[string]string{"DB_PASSWORD": value}}); err != nil {
		t.Fatal(err)
	}
	br := b.signedIn(t, testMember)
	resp := br.do("GET", "/api/secrets", nil, nil)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.Contains(string(raw), value) || !strings.Contains(string(raw), `"name":"db"`) || !strings.Contains(string(raw), "DB_PASSWORD") {
		t.Errorf("GET /api/secrets: %d %s", resp.StatusCode, raw)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	b := setup(t, setupOpts{mutate: func(c *Config) { c.MetricsToken = "metrics-token-0123456789abcdef0123" }})
	br := b.browser(t)
	var h map[string]string
	if code := br.call("GET", "/healthz", nil, &h); code != http.StatusOK || h["controlplane"] != "ok" {
		t.Errorf("healthz: %d %v", code, h)
	}
	br.loadCSRF()
	if code := br.call("GET", "/metrics", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("metrics without its token: %d, want 401", code)
	}
	resp := br.do("GET", "/metrics", nil, http.Header{"Authorization": {"Bearer metrics-token-0123456789abcdef0123"}})
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `levers9_dashboard_http_requests_total{code="200",route="GET /api/session"} 1`) {
		t.Errorf("metrics: %d\n%s", resp.StatusCode, raw)
	}
	for _, hdr := range []string{"X-Content-Type-Options", "X-Frame-Options", "Cache-Control"} {
		if resp.Header.Get(hdr) == "" {
			t.Errorf("no %s header", hdr)
		}
	}
	// The controlplane going away shows on /healthz.
	b.cp.Server.Stop()
	if code := br.call("GET", "/healthz", nil, &h); code != http.StatusServiceUnavailable {
		t.Errorf("healthz with the controlplane down: %d, want 503", code)
	}
}

// TestStartStop: Start returns once listening, Stop is safe twice and
// before Start, and a stopped server no longer answers.
func TestStartStop(t *testing.T) {
	b := setup(t, setupOpts{})
	for i := range 3 {
		cfg := *b.cfg
		cfg.Addr = "127.0.0.1:0"
		s, err := New(&cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			s.Stop() // before Start
			continue
		}
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get("http://" + s.Addr() + "/api/session")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s.Stop()
		s.Stop()
		if _, err := http.Get("http://" + s.Addr() + "/api/session"); err == nil {
			t.Errorf("a stopped server still answers")
		}
	}
}
