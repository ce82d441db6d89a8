package web

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
)

// cspHarness loads src/lib/csp.ts through the TypeScript compiler the app
// builds with and prints, for each NEXT_PUBLIC_API_BASE given, the origins
// and both policies, or the error.
const cspHarness = `
const fs = require("fs"), ts = require("typescript");
const src = fs.readFileSync("src/lib/csp.ts", "utf8");
const js = ts.transpileModule(src, { compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022 } }).outputText;
const m = { exports: {} };
new Function("module", "exports", js)(m, m.exports);
const csp = m.exports;
const out = JSON.parse(process.argv[1]).map((base) => {
  try {
    const o = csp.apiOrigins(base);
    return { http: o.http, ws: o.ws, enforced: csp.enforcedPolicy(o), reportOnly: csp.reportOnlyPolicy(o, "N0NCE") };
  } catch (e) {
    return { error: e.message };
  }
});
console.log(JSON.stringify(out));
`

// TestPolicies checks how the API base becomes the policies' origins:
// https and wss for a remote API, http and ws only on loopback, nothing
// else accepted.
func TestPolicies(t *testing.T) {
	if _, err := CheckNode(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := install(ctx, dir, testenv.LogWriter(t, "WEB_BUILD_LOG")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		base, http, ws, err string
	}{
		{base: "https://dash.example.com", http: "https://dash.example.com", ws: "wss://dash.example.com"},
		{base: "https://dash.example.com:8443/api/", http: "https://dash.example.com:8443", ws: "wss://dash.example.com:8443"},
		{base: "http://127.0.0.1:1997", http: "http://127.0.0.1:1997", ws: "ws://127.0.0.1:1997"},
		{base: "http://localhost:1997", http: "http://localhost:1997", ws: "ws://localhost:1997"},
		{base: "http://[::1]:1997", http: "http://[::1]:1997", ws: "ws://[::1]:1997"},
		{base: "", http: "", ws: ""},
		{base: "http://dash.example.com", err: "must be https (plain http only for localhost or a loopback address)"},
		{base: "ftp://127.0.0.1", err: "must be https"},
		{base: "not a url", err: "is not a URL"},
	}
	var bases []string
	for _, tc := range tests {
		bases = append(bases, tc.base)
	}
	arg, _ := json.Marshal(bases)
	cmd := exec.Command("node", "-e", cspHarness, string(arg))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	var got []struct{ HTTP, WS, Enforced, ReportOnly, Error string }
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(tests) {
		t.Fatalf("harness output %s: %v", out, err)
	}
	for i, tc := range tests {
		g := got[i]
		t.Run(tc.base, func(t *testing.T) {
			if tc.err != "" {
				testenv.CheckErr(t, errString(g.Error), tc.err)
				return
			}
			if g.Error != "" || g.HTTP != tc.http || g.WS != tc.ws {
				t.Fatalf("origins %q %q (error %q), want %q %q", g.HTTP, g.WS, g.Error, tc.http, tc.ws)
			}
			wantEnforced := "object-src 'none'; base-uri 'self'; frame-ancestors 'none'; form-action 'self'"
			if tc.http != "" {
				wantEnforced += " " + tc.http
			}
			if g.Enforced != wantEnforced {
				t.Errorf("enforced %q, want %q", g.Enforced, wantEnforced)
			}
			wantConnect := "connect-src 'self'"
			if tc.http != "" {
				wantConnect += " " + tc.http + " " + tc.ws
			}
			wantReport := "default-src 'self'; script-src 'self' 'nonce-N0NCE'; style-src 'self' 'nonce-N0NCE'; img-src 'self' data:; font-src 'self'; " +
				wantConnect + "; object-src 'none'; base-uri 'self'; frame-ancestors 'none'; form-action 'self'"
			if tc.http != "" {
				wantReport += " " + tc.http
			}
			wantReport += "; report-uri /csp-report"
			if g.ReportOnly != wantReport {
				t.Errorf("report-only\n got %q\nwant %q", g.ReportOnly, wantReport)
			}
		})
	}
}

type errString string

func (e errString) Error() string { return string(e) }
