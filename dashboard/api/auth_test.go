package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/clock"
)

func TestConfigFromEnv(t *testing.T) {
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(testSessionSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{
		"LEVERS9_DASHBOARD_CONTROLPLANE":   "127.0.0.1:1993",
		"LEVERS9_DASHBOARD_TOKEN":          "l9_token",
		"LEVERS9_DASHBOARD_SESSION_SECRET": testSessionSecret,
		"LEVERS9_DASHBOARD_DEV_SIGNIN":     "true",
	}
	tests := []struct {
		name    string
		set     map[string]string
		wantErr []string
		check   func(t *testing.T, c *Config)
	}{
		{name: "defaults", check: func(t *testing.T, c *Config) {
			if c.Addr != "127.0.0.1:1997" || c.PublicURL != "http://127.0.0.1:1997" || c.WebURL != c.PublicURL || c.OIDCIssuer != GoogleIssuer || c.SessionTTL != 12*time.Hour {
				t.Errorf("defaults: %+v", c)
			}
		}},
		{name: "secret from a file", set: map[string]string{"LEVERS9_DASHBOARD_SESSION_SECRET": "", "LEVERS9_DASHBOARD_SESSION_SECRET_FILE": secretFile},
			check: func(t *testing.T, c *Config) {
				if c.SessionSecret != testSessionSecret {
					t.Errorf("session secret from file not read")
				}
			}},
		{name: "every problem at once", set: map[string]string{"LEVERS9_DASHBOARD_CONTROLPLANE": "", "LEVERS9_DASHBOARD_TOKEN": "",
			"LEVERS9_DASHBOARD_SESSION_SECRET": "short", "LEVERS9_DASHBOARD_DEV_SIGNIN": "", "LEVERS9_DASHBOARD_ADMINS": "bob"},
			wantErr: []string{"LEVERS9_DASHBOARD_CONTROLPLANE is not set", "LEVERS9_DASHBOARD_TOKEN", "LEVERS9_DASHBOARD_SESSION_SECRET", "no sign-in is configured", `LEVERS9_DASHBOARD_ADMINS[0]="bob"`}},
		{name: "google needs domains", set: map[string]string{"LEVERS9_DASHBOARD_GOOGLE_CLIENT_ID": "id", "LEVERS9_DASHBOARD_GOOGLE_CLIENT_SECRET": "cs"},
			wantErr: []string{"LEVERS9_DASHBOARD_ALLOWED_DOMAINS is empty"}},
		{name: "plain http issuer off loopback", set: map[string]string{"LEVERS9_DASHBOARD_GOOGLE_CLIENT_ID": "id", "LEVERS9_DASHBOARD_GOOGLE_CLIENT_SECRET": "cs",
			"LEVERS9_DASHBOARD_ALLOWED_DOMAINS": "example.com", "LEVERS9_DASHBOARD_OIDC_ISSUER": "http://idp.example.com"},
			wantErr: []string{"LEVERS9_DASHBOARD_OIDC_ISSUER"}},
		{name: "both value and file", set: map[string]string{"LEVERS9_DASHBOARD_TOKEN_FILE": secretFile}, wantErr: []string{"LEVERS9_DASHBOARD_TOKEN and LEVERS9_DASHBOARD_TOKEN_FILE are both set"}},
		{name: "bad bool", set: map[string]string{"LEVERS9_DASHBOARD_DEV_SIGNIN": "yes please"}, wantErr: []string{`LEVERS9_DASHBOARD_DEV_SIGNIN="yes please"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := map[string]string{}
			for k, v := range base {
				e[k] = v
			}
			for k, v := range tt.set {
				e[k] = v
			}
			c, err := ConfigFromEnv(func(k string) string { return e[k] })
			for _, w := range tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v does not name %q", err, w)
				}
			}
			if len(tt.wantErr) == 0 && err != nil {
				t.Fatal(err)
			}
			if err != nil && strings.Contains(err.Error(), "short") {
				t.Errorf("an error quotes the session secret: %v", err)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

// TestSessionCookieAttributes: HttpOnly, SameSite=Lax, signed, expiring,
// Secure except on a loopback host, Domain from the config.
func TestSessionCookieAttributes(t *testing.T) {
	tests := []struct {
		publicURL, domain string
		secure            bool
	}{
		{"http://127.0.0.1:1997", "", false},
		{"http://localhost:3000", "", false},
		{"https://dash.example.com", "example.com", true},
		{"http://dash.example.com", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.publicURL, func(t *testing.T) {
			cfg := &Config{PublicURL: tt.publicURL, CookieDomain: tt.domain, SessionSecret: testSessionSecret, DevSignIn: true}
			cfg.WithDefaults()
			s := &Server{cfg: cfg, clock: clock.NewFake(time.Unix(1_800_000_000, 0)), signer: newSigner(testSessionSecret), metrics: newMetrics()}
			rec := httptest.NewRecorder()
			if _, err := s.startSession(rec, "a@b.example", viaDev); err != nil {
				t.Fatal(err)
			}
			var c *http.Cookie
			for _, k := range rec.Result().Cookies() {
				if k.Name == sessionCookie {
					c = k
				}
			}
			if c == nil {
				t.Fatal("no session cookie")
			}
			if !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Secure != tt.secure || c.Domain != tt.domain || c.MaxAge != int(12*time.Hour/time.Second) {
				t.Errorf("cookie %+v: want HttpOnly, Lax, Secure=%v, Domain=%q, 12h", c, tt.secure, tt.domain)
			}
		})
	}
}

func TestDevSignInOffByDefault(t *testing.T) {
	b := setup(t, setupOpts{mutate: func(c *Config) {
		c.DevSignIn = false
		c.GoogleClientID, c.GoogleClientSecret, c.AllowedDomains = "client", "client-secret-xyz", []string{"ops.example"}
		c.OIDCIssuer = "http://127.0.0.1:1"
	}})
	br := b.browser(t)
	s := br.loadCSRF()
	if s.DevSignIn || !s.GoogleSignIn || s.SignedIn {
		t.Errorf("session: %+v, want devSignIn false", s)
	}
	var e apiError
	if code := br.call("POST", "/api/auth/dev", map[string]string{"email": testAdmin}, &e); code != http.StatusNotFound {
		t.Errorf("dev sign-in while off: %d %+v, want 404", code, e)
	}
	if s := br.loadCSRF(); s.SignedIn {
		t.Error("signed in although dev sign-in is off")
	}
	// A dev session made while it was on is refused once it is off.
	on := &Server{cfg: &Config{SessionTTL: time.Hour}, clock: clock.Real(), signer: newSigner(testSessionSecret)}
	rec := httptest.NewRecorder()
	if _, err := on.startSession(rec, testAdmin, viaDev); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", b.ts.URL+"/api/tasks", nil)
	for _, c := range rec.Result().Cookies() {
		req.AddCookie(c)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a dev session with dev sign-in off: %d, want 401", resp.StatusCode)
	}
}

func TestDevSignInWarnsAndShows(t *testing.T) {
	b := setup(t, setupOpts{mutate: func(c *Config) { c.Addr = "127.0.0.1:0" }})
	if err := b.api.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.logs.String(), "development sign-in is ON") {
		t.Errorf("no warning in the log while dev sign-in is on:\n%s", b.logs.String())
	}
	br := b.signedIn(t, "Someone@Anywhere.example")
	s := br.loadCSRF()
	if !s.SignedIn || !s.DevSignIn || s.Via != "dev" || s.Email != "someone@anywhere.example" || s.Role != RoleMember {
		t.Errorf("session: %+v", s)
	}
	if s := b.signedIn(t, testAdmin).loadCSRF(); s.Role != RoleAdmin {
		t.Errorf("%s: role %s, want admin", testAdmin, s.Role)
	}
	if code := b.browser(t).call("POST", "/api/auth/dev", map[string]string{"email": "x@y.example"}, nil); code != http.StatusForbidden {
		t.Errorf("dev sign-in without the pre-session CSRF token: %d, want 403", code)
	}
}

// TestCSRF: every state-changing request needs the session's token in
// X-CSRF-Token, and a foreign Origin is refused even with it.
func TestCSRF(t *testing.T) {
	b := setup(t, setupOpts{})
	br := b.signedIn(t, testAdmin)
	good := br.csrf
	tests := []struct {
		name   string
		csrf   string
		origin string
		want   int
	}{
		{"no token", "", "", http.StatusForbidden},
		{"wrong token", "not-the-token", "", http.StatusForbidden},
		{"another session's token", b.signedIn(t, testAdmin).csrf, "", http.StatusForbidden},
		{"foreign origin", good, "http://evil.example", http.StatusForbidden},
		{"right token", good, "", http.StatusCreated},
		{"right token, own origin", good, b.ts.URL, http.StatusCreated},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br.csrf = tt.csrf
			h := http.Header{}
			if tt.origin != "" {
				h.Set("Origin", tt.origin)
			}
			resp := br.do("POST", "/api/tokens", map[string]string{"name": fmt.Sprintf("csrf-%d", i)}, h)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.want)
			}
		})
	}
	br.csrf = ""
	if code := br.call("POST", "/api/auth/signout", nil, nil); code != http.StatusForbidden {
		t.Errorf("sign-out without CSRF: %d, want 403", code)
	}
}

func TestExpiredAndTamperedSessions(t *testing.T) {
	b := setup(t, setupOpts{fake: true})
	br := b.signedIn(t, testMember)
	if code := br.call("GET", "/api/tasks", nil, nil); code != http.StatusOK {
		t.Fatalf("fresh session: %d", code)
	}
	// Tampered: another body under the real signature, or the real body
	// under a changed signature.
	u := b.ts.URL + "/"
	req, _ := http.NewRequest("GET", u, nil)
	var val string
	for _, c := range br.c.Jar.Cookies(req.URL) {
		if c.Name == sessionCookie {
			val = c.Value
		}
	}
	body, sig, _ := strings.Cut(val, ".")
	flipped := []byte(sig)
	flipped[0] ^= 1
	for name, v := range map[string]string{
		"forged body":      forgedSession(t, testAdmin) + "." + sig,
		"broken signature": body + "." + string(flipped),
		"no signature":     body,
	} {
		other := b.browser(t)
		other.c.Jar.SetCookies(req.URL, []*http.Cookie{{Name: sessionCookie, Value: v}})
		if code := other.call("GET", "/api/tasks", nil, nil); code != http.StatusUnauthorized {
			t.Errorf("session with a %s: %d, want 401", name, code)
		}
	}

	b.clock.Advance(12*time.Hour + time.Second)
	if code := br.call("GET", "/api/tasks", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("expired session: %d, want 401", code)
	}
	if s := br.loadCSRF(); s.SignedIn {
		t.Errorf("expired session still signed in: %+v", s)
	}
}

// forgedSession is a session body naming email, unsigned.
func forgedSession(t *testing.T, email string) string {
	t.Helper()
	s := newSigner("some-other-secret-that-is-32-chars-long")
	v, err := s.sign(sessionCookie, session{Email: email, Via: viaDev, CSRF: "x", ExpiresAt: time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	body, _, _ := strings.Cut(v, ".")
	return body
}
