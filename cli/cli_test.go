package cli

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

var env *controlplanetest.Env

func TestMain(m *testing.M) {
	os.Exit(controlplanetest.Main(m, &env))
}

type cliBundle struct {
	home   string
	cert   string
	addr   string
	inst   *controlplanetest.Instance
	envvar map[string]string
}

// setup starts a TLS controlplane and returns a CLI environment with an
// empty LEVERS9_HOME.
func setup(t *testing.T) *cliBundle {
	t.Helper()
	cert, key := controlplanetest.SelfSignedTLS(t)
	cfg := env.Config(t)
	cfg.Controlplane.TLS.CertFile, cfg.Controlplane.TLS.KeyFile = cert, key
	cfg.Worker.DefaultImage = "busybox:clitest"
	in := controlplanetest.Start(t, cfg, true)
	home := filepath.Join(t.TempDir(), "l9home")
	return &cliBundle{home: home, cert: cert, addr: in.Server.GRPCAddr(), inst: in,
		envvar: map[string]string{"LEVERS9_HOME": home}}
}

// run runs the CLI in-process.
func (b *cliBundle) run(t *testing.T, stdin string, extraEnv map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	getenv := func(k string) string {
		if v, ok := extraEnv[k]; ok {
			return v
		}
		return b.envvar[k]
	}
	code = Main(args, IO{In: strings.NewReader(stdin), Out: &out, Err: &errb}, getenv)
	return out.String(), errb.String(), code
}

func TestFirstRunBootstrapsAndSaves(t *testing.T) {
	t.Parallel()
	b := setup(t)
	envs := map[string]string{
		"LEVERS9_BOOTSTRAP_SECRET": "test-bootstrap-secret-0123456789abcdef",
		"LEVERS9_CONTROLPLANE_TLS": "true",
		"LEVERS9_CONTROLPLANE_CA":  b.cert,
	}
	out, errOut, code := b.run(t, b.addr+"\n\n", envs, "token", "list")
	if code != 0 {
		t.Fatalf("first run failed: %s", errOut)
	}
	if !strings.Contains(errOut, "Controlplane address") || !strings.Contains(errOut, "bootstrapped workspace") {
		t.Errorf("prompts missing: %s", errOut)
	}
	if !strings.Contains(out, "admin") {
		t.Errorf("token list lacks the admin token: %s", out)
	}
	st, err := os.Stat(filepath.Join(b.home, "config.toml"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("config file mode = %v, %v; want 0600", st.Mode().Perm(), err)
	}
	if d, _ := os.Stat(b.home); d.Mode().Perm() != 0o700 {
		t.Errorf("config dir mode = %v, want 0700", d.Mode().Perm())
	}

	// Later commands use the saved context with no prompt and no env.
	out, errOut, code = b.run(t, "", nil, "token", "create", "--name", "ci")
	if code != 0 {
		t.Fatalf("token create: %s", errOut)
	}
	secret := strings.TrimSpace(out)
	if !strings.HasPrefix(secret, "levers9_") {
		t.Fatalf("token create printed %q", out)
	}
	out, _, code = b.run(t, "", nil, "token", "list", "-o", "json")
	var list struct {
		Tokens []struct{ Name string } `json:"tokens"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Tokens) != 2 {
		t.Fatalf("token list -o json = %q", out)
	}
	if strings.Contains(out, secret) {
		t.Error("token list shows a secret")
	}
	// config list never shows tokens.
	out, _, _ = b.run(t, "", nil, "config", "list")
	cfgBytes, _ := os.ReadFile(filepath.Join(b.home, "config.toml"))
	if !strings.Contains(string(cfgBytes), "levers9_") || strings.Contains(out, "levers9_") {
		t.Errorf("config list output leaks the token or the file lacks it: %s", out)
	}
	// The new token works through LEVERS9_TOKEN.
	out, errOut, code = b.run(t, "", map[string]string{"LEVERS9_TOKEN": secret}, "whoami")
	if code != 0 || !strings.Contains(out, "workspace default") {
		t.Errorf("whoami with LEVERS9_TOKEN: %s %s", out, errOut)
	}
}

func TestFirstRunWithoutTokenOrSecret(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, errOut, code := b.run(t, b.addr+"\n\n", map[string]string{"LEVERS9_CONTROLPLANE_TLS": "true", "LEVERS9_CONTROLPLANE_CA": b.cert}, "token", "list")
	if code == 0 || !strings.Contains(errOut, "LEVERS9_TOKEN") {
		t.Errorf("want advice to set a token, got %d: %s", code, errOut)
	}
}

func TestConfigCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boot := map[string]string{"LEVERS9_BOOTSTRAP_SECRET": "test-bootstrap-secret-0123456789abcdef"}
	_, errOut, code := b.run(t, "\n", boot, "config", "create", "prod", "--controlplane", b.addr, "--tls", "--ca", b.cert)
	if code != 0 {
		t.Fatalf("config create: %s", errOut)
	}
	// A second context with the same controlplane but no TLS: port is not
	// 443, so it speaks plaintext and the error says to use --tls.
	if _, errOut, code = b.run(t, "\n", nil, "config", "create", "bad", "--controlplane", b.addr, "--rest", "nowhere"); code == 0 || !strings.Contains(errOut, "--rest") {
		t.Fatalf("config create with a bad --rest: %d %s", code, errOut)
	}
	_, _, code = b.run(t, "\n", nil, "config", "create", "plain", "--controlplane", b.addr, "--rest", "127.0.0.1:8444")
	if code != 0 {
		t.Fatal("config create plain")
	}
	_, errOut, code = b.run(t, "", map[string]string{"LEVERS9_TOKEN": "levers9_aaaaaaaaaaaaaaaa_" + strings.Repeat("a", 52)}, "--context", "plain", "token", "list")
	if code == 0 || !strings.Contains(errOut, "--tls") {
		t.Errorf("plaintext to a TLS controlplane: want advice about --tls, got: %s", errOut)
	}
	// LEVERS9_CONTROLPLANE_TLS=true fixes it for a context without tls.
	tok := readToken(t, b.home, "prod")
	_, errOut, code = b.run(t, "", map[string]string{"LEVERS9_TOKEN": tok, "LEVERS9_CONTROLPLANE_TLS": "true", "LEVERS9_CONTROLPLANE_CA": b.cert}, "--context", "plain", "whoami")
	if code != 0 {
		t.Errorf("LEVERS9_CONTROLPLANE_TLS=true: %s", errOut)
	}

	out, _, _ := b.run(t, "", nil, "config", "list", "-o", "json")
	var rows []struct {
		Name     string
		REST     string
		TLS      bool
		HasToken bool
		Current  bool
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("config list -o json = %s (%v)", out, err)
	}
	_, prodPort, _ := net.SplitHostPort(b.addr)
	if rows[1].Name != "prod" || !rows[1].Current || !rows[1].TLS || !rows[1].HasToken || rows[0].TLS || rows[0].HasToken ||
		rows[0].REST != "127.0.0.1:8444" || rows[1].REST != strings.TrimSuffix(b.addr, prodPort)+"1994" {
		t.Errorf("rows = %+v", rows)
	}
	if _, errOut, code = b.run(t, "", nil, "config", "use", "nope"); code == 0 || !strings.Contains(errOut, "config list") {
		t.Errorf("use of a missing context: %s", errOut)
	}
	if _, _, code = b.run(t, "", nil, "config", "use", "plain"); code != 0 {
		t.Error("config use plain")
	}
	if _, _, code = b.run(t, "", nil, "config", "delete", "plain"); code != 0 {
		t.Error("config delete")
	}
	_, errOut, code = b.run(t, "", nil, "token", "list")
	if code == 0 || !strings.Contains(errOut, "config use") {
		t.Errorf("no current context: want advice, got %s", errOut)
	}
	if _, errOut, code = b.run(t, "\n", nil, "config", "create", "prod", "--controlplane", b.addr); code == 0 || !strings.Contains(errOut, "exists") {
		t.Errorf("duplicate context: %s", errOut)
	}
	if _, errOut, code = b.run(t, "\n", nil, "config", "create", "bad", "--controlplane", "no-port"); code == 0 || !strings.Contains(errOut, "HOST:PORT") {
		t.Errorf("bad address: %s", errOut)
	}
}

func TestSecretsFromStdin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boot := map[string]string{"LEVERS9_BOOTSTRAP_SECRET": "test-bootstrap-secret-0123456789abcdef"}
	if _, errOut, code := b.run(t, "\n", boot, "config", "create", "p", "--controlplane", b.addr, "--tls", "--ca", b.cert); code != 0 {
		t.Fatal(errOut)
	}
	out, errOut, code := b.run(t, "# db\nUSER=app\nPASSWORD=s3cr3t-value\n", nil, "secret", "put", "db")
	if code != 0 || !strings.Contains(out, "PASSWORD, USER") || strings.Contains(out+errOut, "s3cr3t-value") {
		t.Fatalf("secret put: %q %q", out, errOut)
	}
	out, _, _ = b.run(t, "", nil, "secret", "list")
	if !strings.Contains(out, "db") || strings.Contains(out, "s3cr3t-value") {
		t.Errorf("secret list: %s", out)
	}
	if _, errOut, code := b.run(t, "garbage line\n", nil, "secret", "put", "x"); code == 0 || !strings.Contains(errOut, "line 1") {
		t.Errorf("bad stdin: %s", errOut)
	}
	if _, errOut, code := b.run(t, "", nil, "secret", "delete", "missing"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("delete missing: %s", errOut)
	}
}

func TestUseTLS(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr    string
		ctxTLS  bool
		env     string
		want    bool
		wantErr bool
	}{
		{"cp.example:443", false, "", true, false},
		{"cp.example:443", false, "false", true, false},
		{"127.0.0.1:1993", false, "", false, false},
		{"127.0.0.1:1993", true, "", true, false},
		{"127.0.0.1:1993", false, "true", true, false},
		{"127.0.0.1:1993", false, "maybe", false, true},
		{"no-port", false, "", false, true},
	}
	for _, tt := range tests {
		got, err := UseTLS(tt.addr, tt.ctxTLS, func(string) string { return tt.env })
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("UseTLS(%q, %v, env %q) = %v, %v", tt.addr, tt.ctxTLS, tt.env, got, err)
		}
	}
}

func readToken(t *testing.T, home, name string) string {
	t.Helper()
	f, err := LoadFile(home)
	if err != nil {
		t.Fatal(err)
	}
	return f.Contexts[name].Token
}

func FuzzParseEnvLines(f *testing.F) {
	f.Add("A=1\n# c\n\nB==2\n")
	f.Add("=x")
	f.Fuzz(func(t *testing.T, s string) {
		vals, err := parseEnvLines(strings.NewReader(s))
		if err == nil {
			for k := range vals {
				if k == "" || strings.ContainsAny(k, "\n") {
					t.Fatalf("bad key %q", k)
				}
			}
		}
	})
}

// adminCLI is a CLI with an admin context on a controlplane that can
// hand out join scripts (it needs an agent binary to checksum).
func adminCLI(t *testing.T) *cliBundle {
	t.Helper()
	return adminCLIWith(t, func(*config.Config) {})
}

// adminCLIWith is adminCLI on a config edit first changes.
func adminCLIWith(t *testing.T, edit func(*config.Config)) *cliBundle {
	t.Helper()
	cert, key := controlplanetest.SelfSignedTLS(t)
	cfg := env.Config(t)
	edit(cfg)
	cfg.Controlplane.TLS.CertFile, cfg.Controlplane.TLS.KeyFile = cert, key
	cfg.Controlplane.AgentBinariesDir = t.TempDir()
	if err := os.WriteFile(filepath.Join(cfg.Controlplane.AgentBinariesDir, "levers9-agent-linux-amd64"), []byte("agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	in := controlplanetest.Start(t, cfg, true)
	b := &cliBundle{home: filepath.Join(t.TempDir(), "h"), cert: cert, addr: in.Server.GRPCAddr(), inst: in}
	b.envvar = map[string]string{"LEVERS9_HOME": b.home}
	if _, errOut, code := b.run(t, "\n", map[string]string{"LEVERS9_BOOTSTRAP_SECRET": "test-bootstrap-secret-0123456789abcdef"},
		"config", "create", "p", "--controlplane", b.addr, "--tls", "--ca", cert); code != 0 {
		t.Fatal(errOut)
	}
	return b
}
