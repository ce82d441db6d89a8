package api

import (
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
)

const (
	opClientID     = "levers9-dashboard"
	opClientSecret = "op-client-secret-never-logged-0123"
	opPassword     = "correct-horse"
)

// startOP runs a real OpenID provider (zitadel's op package with its
// example storage and login form) on a loopback port, with a web client
// whose only redirect URI is redirectURI, and three users: one in the
// allowed domain, one outside it, one whose email is not verified.
func startOP(t *testing.T, redirectURI string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := "http://" + ln.Addr().String()
	users := map[string]*storage.User{
		"u1": {ID: "u1", Username: "alice", Password: opPassword, Email: "Alice@Ops.Example", EmailVerified: true},
		"u2": {ID: "u2", Username: "mallory", Password: opPassword, Email: "mallory@elsewhere.example", EmailVerified: true},
		"u3": {ID: "u3", Username: "eve", Password: opPassword, Email: "eve@ops.example", EmailVerified: false},
	}
	b, err := json.Marshal(users)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "users.json")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	us, err := storage.StoreFromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	st := storage.NewStorageWithClients(us, map[string]*storage.Client{opClientID: storage.WebClient(opClientID, opClientSecret, redirectURI)})
	srv := &http.Server{Handler: exampleop.SetupServer(issuer, st, nil, false), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return issuer
}

// oidcWorld is the dashboard with Google sign-in pointed at a real
// provider started by the test.
func oidcWorld(t *testing.T) *bundle {
	t.Helper()
	var issuer string
	return setup(t, setupOpts{fake: true, mutate: func(c *Config) {
		issuer = startOP(t, c.PublicURL+"/api/auth/google/callback")
		c.DevSignIn = false
		c.OIDCIssuer, c.GoogleClientID, c.GoogleClientSecret = issuer, opClientID, opClientSecret
		c.AllowedDomains = []string{"ops.example"}
		c.Admins = []string{"@ops.example"}
		c.WebURL = "http://127.0.0.1:1"
	}})
}

// expectRedirect checks a redirect and returns its absolute Location.
func expectRedirect(t *testing.T, resp *http.Response, what string) *url.URL {
	t.Helper()
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound && resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("%s: status %d, want a redirect", what, resp.StatusCode)
	}
	loc, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
	if err != nil {
		t.Fatalf("%s: Location %q: %v", what, resp.Header.Get("Location"), err)
	}
	return loc
}

// toProvider starts sign-in and signs in at the provider's form as user,
// returning the provider's redirect back to the dashboard (not yet
// followed).
func toProvider(t *testing.T, br *browser, user string) *url.URL {
	t.Helper()
	auth := expectRedirect(t, br.do("GET", "/api/auth/google/start?next=/tasks/t_1", nil, nil), "start")
	q := auth.Query()
	if q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("state") == "" || q.Get("nonce") == "" {
		t.Fatalf("authorization request without PKCE, state or nonce: %s", auth)
	}
	login := expectRedirect(t, br.do("GET", auth.String(), nil, nil), "provider authorize")
	id := login.Query().Get("authRequestID")
	if id == "" {
		t.Fatalf("provider did not send to its login form: %s", login)
	}
	form := url.Values{"username": {user}, "password": {opPassword}, "id": {id}}
	req, _ := http.NewRequest("POST", login.Scheme+"://"+login.Host+"/login/username", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := br.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	cb := expectRedirect(t, resp, "provider login")
	back := expectRedirect(t, br.do("GET", cb.String(), nil, nil), "provider callback")
	if !strings.HasSuffix(back.Path, "/api/auth/google/callback") || back.Query().Get("code") == "" {
		t.Fatalf("provider did not come back with a code: %s", back)
	}
	return back
}

func TestGoogleSignIn(t *testing.T) {
	tests := []struct {
		name      string
		user      string
		tamper    func(b *bundle, u *url.URL)
		wantError string // "" means signed in
	}{
		{name: "allowed domain", user: "alice"},
		{name: "wrong domain refused", user: "mallory", wantError: "domain_not_allowed"},
		{name: "unverified email refused", user: "eve", wantError: "email_unverified"},
		{name: "tampered state refused", user: "alice", wantError: "state_mismatch", tamper: func(_ *bundle, u *url.URL) {
			q := u.Query()
			q.Set("state", q.Get("state")+"x")
			u.RawQuery = q.Encode()
		}},
		{name: "stale flow refused", user: "alice", wantError: "flow_expired", tamper: func(b *bundle, _ *url.URL) {
			b.clock.Advance(oidcFlowTTL + time.Second)
		}},
		{name: "stolen code refused", user: "alice", wantError: "exchange_failed", tamper: func(_ *bundle, u *url.URL) {
			q := u.Query()
			q.Set("code", "not-the-code")
			u.RawQuery = q.Encode()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := oidcWorld(t)
			br := b.browser(t)
			back := toProvider(t, br, tt.user)
			if tt.tamper != nil {
				tt.tamper(b, back)
			}
			end := expectRedirect(t, br.do("GET", back.String(), nil, nil), "dashboard callback")
			s := br.loadCSRF()
			if tt.wantError != "" {
				if end.Path != "/signin" || end.Query().Get("error") != tt.wantError {
					t.Errorf("ended at %s, want /signin?error=%s", end, tt.wantError)
				}
				if s.SignedIn {
					t.Errorf("signed in: %+v", s)
				}
				return
			}
			if end.String() != "http://127.0.0.1:1/tasks/t_1" {
				t.Errorf("ended at %s, want the web app's /tasks/t_1", end)
			}
			if !s.SignedIn || s.Email != "alice@ops.example" || s.Via != "google" || s.Role != RoleAdmin {
				t.Errorf("session: %+v", s)
			}
			if code := br.call("GET", "/api/machines", nil, nil); code != http.StatusOK {
				t.Errorf("admin after Google sign-in: GET /api/machines %d", code)
			}
			// The flow cookie is single-use: the same answer again is refused.
			again := expectRedirect(t, br.do("GET", back.String(), nil, nil), "replayed callback")
			if again.Query().Get("error") != "no_flow" {
				t.Errorf("replayed callback ended at %s, want error=no_flow", again)
			}
			b.clock.Advance(12*time.Hour + time.Second)
			if code := br.call("GET", "/api/tasks", nil, nil); code != http.StatusUnauthorized {
				t.Errorf("expired Google session: %d, want 401", code)
			}
		})
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{"/tasks": "/tasks", "//evil.example": "/", "https://evil.example": "/", "": "/", "/\\evil": "/", "tasks": "/"} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}
