package web

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
)

// serve builds the app (cached after the first run) and starts it.
func serve(t *testing.T) (*Server, *testenv.SyncBuffer) {
	t.Helper()
	if _, err := CheckNode(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	b, err := Make(ctx, BuildOptions{Dir: dir, APIBase: fmt.Sprintf("http://127.0.0.1:%d", APIPortForTest), Log: testenv.LogWriter(t, "WEB_BUILD_LOG")})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("web build: %s (cached %v, npm ci %v)", b.Took.Round(time.Millisecond), b.Cached, b.Installed)
	out := &testenv.SyncBuffer{}
	s, err := b.Serve(ctx, out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(s.Stop)
	return s, out
}

// TestSecurityHeaders asks every route, page or not, for its headers.
func TestSecurityHeaders(t *testing.T) {
	s, _ := serve(t)
	api := fmt.Sprintf("http://127.0.0.1:%d", APIPortForTest)
	enforced := "object-src 'none'; base-uri 'self'; frame-ancestors 'none'; form-action 'self' " + api

	get := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, s.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	// A script of the build, to check assets too.
	_, home := get("GET", "/")
	asset := regexp.MustCompile(`/_next/static/[^"]+\.js`).FindString(home)
	if asset == "" {
		t.Fatalf("no script asset in the home page:\n%s", home)
	}
	nonceRe := regexp.MustCompile(`script-src 'self' 'nonce-([A-Za-z0-9+/=]+)'`)
	tests := []struct {
		method, path string
		status       int
		page         bool
	}{
		{"GET", "/", 200, true},
		{"GET", "/signin", 200, true},
		{"GET", "/tasks", 200, true},
		{"GET", "/tasks/t_abc", 200, true},
		{"GET", "/machines", 200, true},
		{"GET", "/tokens", 200, true},
		{"GET", "/secrets", 200, true},
		{"GET", "/security", 200, true},
		{"GET", "/no/such/page", 404, true},
		{"GET", asset, 200, false},
		{"POST", "/csp-report", 204, false},
	}
	nonces := map[string]bool{}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			resp, body := get(tc.method, tc.path)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			for k, want := range map[string]string{
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "strict-origin-when-cross-origin",
				"X-Frame-Options":         "DENY",
				"Content-Security-Policy": enforced,
			} {
				if got := resp.Header.Values(k); len(got) != 1 || got[0] != want {
					t.Errorf("%s: %q, want exactly %q", k, got, want)
				}
			}
			if resp.Header.Get("X-Powered-By") != "" {
				t.Errorf("X-Powered-By sent")
			}
			ro := resp.Header.Get("Content-Security-Policy-Report-Only")
			if !tc.page {
				return
			}
			for _, want := range []string{
				"default-src 'self'",
				"connect-src 'self' " + api + " ws://127.0.0.1:" + fmt.Sprint(APIPortForTest),
				"object-src 'none'", "base-uri 'self'", "frame-ancestors 'none'",
				"form-action 'self' " + api, "report-uri /csp-report",
			} {
				if !strings.Contains(ro, want) {
					t.Errorf("report-only policy %q lacks %q", ro, want)
				}
			}
			m := nonceRe.FindStringSubmatch(ro)
			if m == nil {
				t.Fatalf("report-only policy %q has no script nonce", ro)
			}
			if nonces[m[1]] {
				t.Errorf("nonce %s used twice", m[1])
			}
			nonces[m[1]] = true
			// Every script Next.js rendered carries this response's nonce.
			scripts := regexp.MustCompile(`<script[^>]*>`).FindAllString(body, -1)
			if len(scripts) == 0 {
				t.Fatalf("no scripts in %s", tc.path)
			}
			for _, sc := range scripts {
				if !strings.Contains(sc, `nonce="`+m[1]+`"`) {
					t.Errorf("script without this response's nonce: %s", sc)
				}
			}
		})
	}
}

// TestCSPReport posts violation reports: each becomes one csp-report line
// without query strings, a body over the bound is refused, and a flood is
// cut by the rate limit.
func TestCSPReport(t *testing.T) {
	s, out := serve(t)
	post := func(ctype, body string) int {
		t.Helper()
		resp, err := http.Post(s.URL+"/csp-report", ctype, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	lines := func() []string {
		var l []string
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.Contains(line, `"msg":"csp-report"`) {
				l = append(l, line)
			}
		}
		return l
	}

	legacy := `{"csp-report":{"document-uri":"http://127.0.0.1/tasks?token=SECRET","violated-directive":"script-src-elem",` +
		`"effective-directive":"script-src-elem","blocked-uri":"inline","disposition":"report","line-number":3}}`
	if code := post("application/csp-report", legacy); code != 204 {
		t.Fatalf("legacy report: %d", code)
	}
	modern := `[{"type":"csp-violation","body":{"documentURL":"http://127.0.0.1/machines#x","effectiveDirective":"connect-src",` +
		`"blockedURL":"https://elsewhere.example/x?y=1","disposition":"report"}}]`
	if code := post("application/reports+json", modern); code != 204 {
		t.Fatalf("reporting API report: %d", code)
	}
	testenv.Eventually(t, 5*time.Second, "two csp-report lines", func() bool { return len(lines()) == 2 })
	got := lines()
	for _, want := range []string{`"documentUri":"http://127.0.0.1/tasks"`, `"violatedDirective":"script-src-elem"`, `"blockedUri":"inline"`} {
		if !strings.Contains(got[0], want) {
			t.Errorf("line %s lacks %s", got[0], want)
		}
	}
	if strings.Contains(out.String(), "SECRET") || strings.Contains(got[1], "y=1") {
		t.Errorf("a query string reached the log:\n%s", strings.Join(got, "\n"))
	}
	if !strings.Contains(got[1], `"effectiveDirective":"connect-src"`) || !strings.Contains(got[1], `"blockedUri":"https://elsewhere.example/x"`) {
		t.Errorf("reporting API line: %s", got[1])
	}

	big := `{"csp-report":{"document-uri":"` + strings.Repeat("a", 20000) + `"}}`
	if code := post("application/csp-report", big); code != 413 {
		t.Errorf("a 20 KB report: %d, want 413", code)
	}
	if code := post("application/csp-report", "not json"); code != 204 || len(lines()) != 2 {
		t.Errorf("garbage: %d, %d lines", code, len(lines()))
	}

	// 4 requests so far of a burst of 30: a flood of 100 gets about 26
	// through (plus what refills meanwhile), the rest 429.
	limited := 0
	for range 100 {
		if post("application/csp-report", legacy) == 429 {
			limited++
		}
	}
	time.Sleep(500 * time.Millisecond) // let the accepted lines reach the log
	n := len(lines())
	if limited < 60 || n > 2+40 {
		t.Errorf("flood of 100: %d refused, %d lines logged; want most refused", limited, n)
	}
	t.Logf("flood of 100 reports: %d refused with 429, %d lines logged", limited, n-2)
}
