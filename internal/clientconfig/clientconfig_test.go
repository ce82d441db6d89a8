package clientconfig

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
)

// env is a getenv over a map.
func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func sampleFile() *File {
	return &File{
		Current: "prod",
		Contexts: map[string]Context{
			"prod": {Controlplane: "cp.example.test:443", Token: "l9_prod"},
			"dev":  {Controlplane: "127.0.0.1:7443", Token: "l9_dev", TLS: true, CAFile: "/tmp/ca.pem"},
			"anon": {Controlplane: "127.0.0.1:7000"},
		},
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		file *File
		// want is what LoadFile returns (nil contexts come back empty).
		want *File
	}{
		{name: "several contexts", file: sampleFile(), want: sampleFile()},
		{name: "no contexts", file: &File{}, want: &File{Contexts: map[string]Context{}}},
		{name: "no current", file: &File{Contexts: map[string]Context{"a": {Controlplane: "h:1"}}},
			want: &File{Contexts: map[string]Context{"a": {Controlplane: "h:1"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "home", ".levers9")
			if err := tc.file.Save(dir); err != nil {
				t.Fatal(err)
			}
			got, err := LoadFile(dir)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("round trip:\n got %+v\nwant %+v", got, tc.want)
			}
			st, err := os.Stat(filepath.Join(dir, "config.toml"))
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("config.toml mode %v, want 0600 (it holds tokens)", st.Mode().Perm())
			}
			dst, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if dst.Mode().Perm() != 0o700 {
				t.Errorf("config dir mode %v, want 0700", dst.Mode().Perm())
			}
		})
	}
}

// TestSaveTightensLooserFile: a config.toml someone made world-readable is
// 0600 again after a save.
func TestSaveTightensLooserFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(p, []byte("current = \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sampleFile().Save(dir); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v after save, want 0600", st.Mode().Perm())
	}
}

func TestLoadFileErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		contents *string // nil: no file
		isNoConf bool
		wantMsg  []string
	}{
		{name: "missing file", isNoConf: true},
		{name: "not toml", contents: ptr("current = [oops\n"), wantMsg: []string{"config.toml", "does not parse (fix or delete it)"}},
		{name: "unknown key", contents: ptr("current = \"a\"\ncolour = \"blue\"\n"), wantMsg: []string{"config.toml", "does not parse"}},
		{name: "wrong type", contents: ptr("current = 3\n"), wantMsg: []string{"does not parse"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			p := filepath.Join(dir, "config.toml")
			if tc.contents != nil {
				if err := os.WriteFile(p, []byte(*tc.contents), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			f, err := LoadFile(dir)
			if f != nil || err == nil {
				t.Fatalf("LoadFile = %+v, %v; want an error", f, err)
			}
			if errors.Is(err, ErrNoConfig) != tc.isNoConf {
				t.Errorf("errors.Is(err, ErrNoConfig) = %v, want %v (err %v)", !tc.isNoConf, tc.isNoConf, err)
			}
			for _, m := range tc.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
			if tc.contents != nil {
				// A file that does not parse is left exactly as it was.
				if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, []byte(*tc.contents)) {
					t.Errorf("config.toml changed to %q (%v)", b, err)
				}
			}
		})
	}
}

func ptr(s string) *string { return &s }

func TestDir(t *testing.T) {
	t.Parallel()
	home, err := os.UserHomeDir()
	if err != nil {
		t.Skip("no home directory:", err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{name: "default", want: filepath.Join(home, ".levers9")},
		{name: "LEVERS9_HOME", env: map[string]string{"LEVERS9_HOME": "/srv/l9"}, want: "/srv/l9"},
	} {
		got, err := Dir(env(tc.env))
		if err != nil || got != tc.want {
			t.Errorf("%s: Dir = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

func TestNames(t *testing.T) {
	t.Parallel()
	if got, want := sampleFile().Names(), []string{"anon", "dev", "prod"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Names = %v, want %v", got, want)
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	if err := sampleFile().Save(home); err != nil {
		t.Fatal(err)
	}
	noCurrent := t.TempDir()
	if err := (&File{Contexts: sampleFile().Contexts}).Save(noCurrent); err != nil {
		t.Fatal(err)
	}
	prod, dev := sampleFile().Contexts["prod"], sampleFile().Contexts["dev"]
	for _, tc := range []struct {
		name     string
		env      map[string]string
		arg      string // the --context flag
		want     Context
		wantName string
		wantErr  []string // substrings; nil means success
		noConfig bool
	}{
		{name: "current context", env: map[string]string{"LEVERS9_HOME": home}, want: prod, wantName: "prod"},
		{name: "named context", env: map[string]string{"LEVERS9_HOME": home}, arg: "dev", want: dev, wantName: "dev"},
		{name: "LEVERS9_CONTEXT", env: map[string]string{"LEVERS9_HOME": home, "LEVERS9_CONTEXT": "dev"}, want: dev, wantName: "dev"},
		{name: "argument beats LEVERS9_CONTEXT", env: map[string]string{"LEVERS9_HOME": home, "LEVERS9_CONTEXT": "dev"}, arg: "prod", want: prod, wantName: "prod"},
		{name: "LEVERS9_TOKEN overrides the file's token", env: map[string]string{"LEVERS9_HOME": home, "LEVERS9_TOKEN": "l9_env"},
			want: Context{Controlplane: prod.Controlplane, Token: "l9_env"}, wantName: "prod"},
		{name: "LEVERS9_CONTROLPLANE skips the file", env: map[string]string{"LEVERS9_HOME": home, "LEVERS9_CONTROLPLANE": "10.1.2.3:7000", "LEVERS9_CONTROLPLANE_CA": "/ca.pem", "LEVERS9_TOKEN": "l9_env"},
			want: Context{Controlplane: "10.1.2.3:7000", CAFile: "/ca.pem", Token: "l9_env"}, wantName: EnvironmentContext},
		{name: "LEVERS9_CONTROLPLANE without a file", env: map[string]string{"LEVERS9_HOME": t.TempDir(), "LEVERS9_CONTROLPLANE": "h:1"},
			want: Context{Controlplane: "h:1"}, wantName: EnvironmentContext},
		{name: "no file", env: map[string]string{"LEVERS9_HOME": t.TempDir()}, noConfig: true, wantErr: []string{"no levers9 CLI config"}},
		{name: "unknown context", env: map[string]string{"LEVERS9_HOME": home}, arg: "nope", wantErr: []string{`no context "nope"`, "levers9 config list"}},
		{name: "no current context", env: map[string]string{"LEVERS9_HOME": noCurrent}, wantErr: []string{"no current context", "levers9 config use", "anon, dev, prod"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, name, err := Resolve(env(tc.env), tc.arg)
			if tc.wantErr == nil {
				if err != nil || got != tc.want || name != tc.wantName {
					t.Fatalf("Resolve = %+v, %q, %v; want %+v, %q", got, name, err, tc.want, tc.wantName)
				}
				return
			}
			if err == nil {
				t.Fatalf("Resolve = %+v, %q; want an error", got, name)
			}
			if errors.Is(err, ErrNoConfig) != tc.noConfig {
				t.Errorf("errors.Is(err, ErrNoConfig) wrong for %v", err)
			}
			for _, m := range tc.wantErr {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
			if strings.Contains(err.Error(), "l9_") {
				t.Errorf("error %q holds a token", err)
			}
		})
	}
}

func TestUseTLS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr    string
		ctxTLS  bool
		env     string // LEVERS9_CONTROLPLANE_TLS
		want    bool
		wantErr string
	}{
		{addr: "cp.example.test:443", want: true},
		{addr: "cp.example.test:443", env: "false", want: true},
		{addr: "127.0.0.1:7000", want: false},
		{addr: "127.0.0.1:7000", ctxTLS: true, want: true},
		{addr: "127.0.0.1:7000", env: "true", want: true},
		{addr: "127.0.0.1:7000", env: "false", want: false},
		{addr: "127.0.0.1:7000", env: "sometimes", wantErr: "LEVERS9_CONTROLPLANE_TLS"},
		{addr: "no-port", wantErr: "not HOST:PORT"},
	} {
		got, err := UseTLS(tc.addr, tc.ctxTLS, env(map[string]string{"LEVERS9_CONTROLPLANE_TLS": tc.env}))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("UseTLS(%q, %v, %q) = %v, %v; want error with %q", tc.addr, tc.ctxTLS, tc.env, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("UseTLS(%q, %v, %q) = %v, %v; want %v", tc.addr, tc.ctxTLS, tc.env, got, err, tc.want)
		}
	}
}

func TestDialCAFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		c       Context
		env     map[string]string
		wantErr string
	}{
		{name: "plaintext", c: Context{Controlplane: "127.0.0.1:7000"}},
		{name: "tls without CA", c: Context{Controlplane: "127.0.0.1:443"}},
		{name: "missing CA file", c: Context{Controlplane: "127.0.0.1:7000", TLS: true, CAFile: filepath.Join(dir, "none.pem")}, wantErr: "read CA file"},
		{name: "CA file without PEM", c: Context{Controlplane: "127.0.0.1:7000", TLS: true, CAFile: notPEM}, wantErr: "holds no PEM certificate"},
		{name: "LEVERS9_CONTROLPLANE_CA overrides", c: Context{Controlplane: "127.0.0.1:7000", TLS: true, CAFile: "/unused"},
			env: map[string]string{"LEVERS9_CONTROLPLANE_CA": notPEM}, wantErr: "not.pem holds no PEM"},
		{name: "bad address", c: Context{Controlplane: "nowhere"}, wantErr: "not HOST:PORT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn, err := Dial(tc.c, env(tc.env))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				conn.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Dial err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestWithToken(t *testing.T) {
	t.Parallel()
	ctx := WithToken(context.Background(), "l9_abc")
	md, _ := metadata.FromOutgoingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer l9_abc" {
		t.Errorf("authorization = %v", got)
	}
	if _, ok := metadata.FromOutgoingContext(WithToken(context.Background(), "")); ok {
		t.Error("an empty token added metadata")
	}
}

func TestExplainTransport(t *testing.T) {
	t.Parallel()
	c := Context{Controlplane: "127.0.0.1:7000"}
	for _, tc := range []struct {
		msg    string
		useTLS bool
		want   string // "" means returned unchanged
	}{
		{msg: "tls: first record does not look like a TLS handshake", useTLS: true, want: "does not speak TLS"},
		{msg: "error reading server preface: EOF", want: "probably wants TLS"},
		{msg: "x509: certificate signed by unknown authority", useTLS: true, want: "--ca FILE"},
		{msg: "dial tcp 127.0.0.1:7000: connect: connection refused", want: "nothing listens on 127.0.0.1:7000"},
		{msg: "something else", want: ""},
	} {
		orig := errors.New(tc.msg)
		got := ExplainTransport(orig, c, tc.useTLS)
		if !errors.Is(got, orig) {
			t.Errorf("%q: explanation %v does not wrap the error", tc.msg, got)
		}
		if tc.want == "" {
			if got != orig {
				t.Errorf("%q: changed to %v", tc.msg, got)
			}
			continue
		}
		if !strings.Contains(got.Error(), tc.want) {
			t.Errorf("%q: explanation %q does not say %q", tc.msg, got, tc.want)
		}
	}
}

func TestRESTAddress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		c       Context
		env     string // LEVERS9_REST
		want    string
		wantErr string
	}{
		{name: "default port on the controlplane's host", c: Context{Controlplane: "cp.example.test:1993"}, want: "cp.example.test:1994"},
		{name: "ipv6 host", c: Context{Controlplane: "[::1]:1993"}, want: "[::1]:1994"},
		{name: "context's rest", c: Context{Controlplane: "cp:1993", REST: "api.example.test:8443"}, want: "api.example.test:8443"},
		{name: "env wins", c: Context{Controlplane: "cp:1993", REST: "api:8443"}, env: "127.0.0.1:9000", want: "127.0.0.1:9000"},
		{name: "bad env", c: Context{Controlplane: "cp:1993"}, env: "nowhere", wantErr: "LEVERS9_REST"},
		{name: "bad port", c: Context{Controlplane: "cp:1993", REST: "api:http"}, wantErr: `rest "api:http"`},
		{name: "no host", c: Context{Controlplane: "cp:1993", REST: ":8443"}, wantErr: "not HOST:PORT"},
		{name: "bad controlplane", c: Context{Controlplane: "cp"}, wantErr: "not HOST:PORT"},
	} {
		got, err := RESTAddress(tc.c, env(map[string]string{"LEVERS9_REST": tc.env}))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: RESTAddress = %q, %v; want error with %q", tc.name, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: RESTAddress = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
