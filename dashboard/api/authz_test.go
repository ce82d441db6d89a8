package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// dialWS opens a WebSocket with the browser's cookies; it returns the
// connection (nil when refused) and the handshake's status.
func (br *browser) dialWS(ctx context.Context, path string, header http.Header) (*websocket.Conn, int) {
	br.t.Helper()
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(br.base, "http")+path, &websocket.DialOptions{HTTPClient: br.c, HTTPHeader: header})
	if err != nil {
		if resp == nil {
			br.t.Fatalf("dial %s: %v", path, err)
		}
		return nil, resp.StatusCode
	}
	return c, http.StatusSwitchingProtocols
}

// TestAuthorization checks every route for an anonymous visitor, a member
// and an admin, and that the table covers every route the API has.
func TestAuthorization(t *testing.T) {
	b := setup(t, setupOpts{machine: true})
	task := b.submit(t, "sleep", "1h")
	tokens := v1.NewTokenServiceClient(b.cp.Conn)
	revocable := func() string {
		resp, err := tokens.CreateToken(b.admin, &v1.CreateTokenRequest{Name: fmt.Sprintf("r%d", time.Now().UnixNano())})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Token.Id
	}
	const (
		ok      = http.StatusOK
		created = http.StatusCreated
		ws      = http.StatusSwitchingProtocols
		noAuth  = http.StatusUnauthorized
		denied  = http.StatusForbidden
		empty   = http.StatusNoContent
	)
	routes := []struct {
		pattern string
		path    func() string
		body    any
		// want is the status for anonymous, member, admin.
		want [3]int
	}{
		{pattern: "GET /api/session", want: [3]int{ok, ok, ok}},
		{pattern: "GET /api/auth/google/start", want: [3]int{http.StatusNotFound, http.StatusNotFound, http.StatusNotFound}},
		{pattern: "GET /api/auth/google/callback", want: [3]int{http.StatusNotFound, http.StatusNotFound, http.StatusNotFound}},
		{pattern: "POST /api/auth/dev", body: map[string]string{"email": "x@y.example"}, want: [3]int{ok, ok, ok}},
		{pattern: "POST /api/auth/signout", want: [3]int{empty, empty, empty}},
		{pattern: "GET /api/tasks", want: [3]int{noAuth, ok, ok}},
		{pattern: "GET /api/tasks/{id}", path: func() string { return "/api/tasks/" + task.Id }, want: [3]int{noAuth, ok, ok}},
		{pattern: "POST /api/tasks/{id}/cancel", path: func() string { return "/api/tasks/" + task.Id + "/cancel" }, want: [3]int{noAuth, ok, ok}},
		{pattern: "GET /api/tasks/{id}/logs", path: func() string { return "/api/tasks/" + task.Id + "/logs" }, want: [3]int{noAuth, ok, ok}},
		{pattern: "GET /api/pools", want: [3]int{noAuth, ok, ok}},
		{pattern: "GET /api/machines", want: [3]int{noAuth, denied, ok}},
		{pattern: "GET /api/machines/{id}", path: func() string { return "/api/machines/" + b.machine.ID }, want: [3]int{noAuth, denied, ok}},
		{pattern: "GET /api/tokens", want: [3]int{noAuth, denied, ok}},
		{pattern: "POST /api/tokens", body: map[string]string{"name": "authz"}, want: [3]int{noAuth, denied, created}},
		{pattern: "DELETE /api/tokens/{id}", path: func() string { return "/api/tokens/" + revocable() }, want: [3]int{noAuth, denied, ok}},
		{pattern: "GET /api/secrets", want: [3]int{noAuth, ok, ok}},
		{pattern: "GET /api/security", want: [3]int{noAuth, denied, ok}},
		{pattern: "GET /api/ws/tasks", want: [3]int{noAuth, ws, ws}},
		{pattern: "GET /api/ws/tasks/{id}", path: func() string { return "/api/ws/tasks/" + task.Id }, want: [3]int{noAuth, ws, ws}},
		{pattern: "GET /api/ws/machines", want: [3]int{noAuth, denied, ws}},
	}
	covered := map[string]bool{}
	for _, r := range routes {
		covered[r.pattern] = true
	}
	for _, p := range b.api.patterns {
		if !covered[p] {
			t.Errorf("route %s is not in the authorization table", p)
		}
	}
	who := []struct {
		name string
		br   func() *browser
	}{
		{"anonymous", func() *browser { br := b.browser(t); br.loadCSRF(); return br }},
		{"member", func() *browser { return b.signedIn(t, testMember) }},
		{"admin", func() *browser { return b.signedIn(t, testAdmin) }},
	}
	for _, r := range routes {
		for i, w := range who {
			t.Run(r.pattern+"/"+w.name, func(t *testing.T) {
				br := w.br()
				br.t = t
				method, path, _ := strings.Cut(r.pattern, " ")
				if r.path != nil {
					path = r.path()
				}
				var got int
				if strings.HasPrefix(path, "/api/ws/") {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					var c *websocket.Conn
					if c, got = br.dialWS(ctx, path, nil); c != nil {
						c.CloseNow()
					}
				} else {
					var e apiError
					got = br.call(method, path, r.body, &e)
					if got >= 400 && e.Error.Code == "" {
						t.Errorf("error answer without an error code")
					}
				}
				if got != r.want[i] {
					t.Errorf("%s %s as %s: %d, want %d", method, path, w.name, got, r.want[i])
				}
			})
		}
	}
	// Cross-site WebSocket hijacking: a signed-in browser on another site.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, code := b.signedIn(t, testAdmin).dialWS(ctx, "/api/ws/machines", http.Header{"Origin": {"http://evil.example"}}); c != nil || code != http.StatusForbidden {
		t.Errorf("WebSocket from a foreign origin: %d, want 403", code)
	}
}
