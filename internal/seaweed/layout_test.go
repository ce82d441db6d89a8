package seaweed_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/seaweed"
)

// TestLayout checks what a cluster is started with, without starting it:
// the ports given are kept and the missing ones picked, each server's
// argv points at the others and holds no password, the password reaches
// the filer only through its environment, and filer.toml is 0600 without
// it (even over an older, looser file).
func TestLayout(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const secret = "s3cret-pg-password"
	l, err := seaweed.NewLayout(seaweed.ClusterOptions{
		Bin: "/opt/weed", Dir: dir,
		MasterPort: 19333, MasterGRPCPort: 29333, VolumePort: 18080, FilerPort: 18888, FilerGRPCPort: 28888,
		Postgres: seaweed.PostgresStore{Host: "127.0.0.1", Port: 5432, User: "levers9", Password: secret, Database: "seaweedfs"},
	})
	if err != nil {
		t.Fatal(err)
	}
	o := l.Options()
	if o.Host != "127.0.0.1" || o.VolumeGRPCPort == 0 || o.VolumeSizeLimitMB != 64 {
		t.Errorf("defaults not filled in: host %q, volume gRPC port %d, volume size limit %d", o.Host, o.VolumeGRPCPort, o.VolumeSizeLimitMB)
	}
	if got, want := l.MasterAddr(), "127.0.0.1:19333.29333"; got != want {
		t.Errorf("MasterAddr = %q, want %q", got, want)
	}
	if got, want := l.FilerAddr(), "127.0.0.1:18888.28888"; got != want {
		t.Errorf("FilerAddr = %q, want %q", got, want)
	}
	if got, want := l.FilerURL(), "http://127.0.0.1:18888"; got != want {
		t.Errorf("FilerURL = %q, want %q", got, want)
	}

	servers := l.Servers()
	var names []string
	for _, s := range servers {
		names = append(names, s.Name)
		if strings.Contains(strings.Join(s.Args, " "), secret) {
			t.Errorf("%s argv holds the Postgres password: %q", s.Name, s.Args)
		}
		if s.Args[0] != s.Name || !slices.Contains(s.Args, "-ip.bind=127.0.0.1") {
			t.Errorf("%s argv = %q, want the subcommand first and bound to 127.0.0.1", s.Name, s.Args)
		}
		if filepath.Dir(s.LogPath) != filepath.Join(dir, "logs") || !strings.HasPrefix(s.Dir, dir) {
			t.Errorf("%s: log %s, dir %s, want both under %s", s.Name, s.LogPath, s.Dir, dir)
		}
		if s.Name != "master" && !slices.Contains(s.Args, "-master=127.0.0.1:19333.29333") {
			t.Errorf("%s argv = %q, want -master=%s", s.Name, s.Args, l.MasterAddr())
		}
		hasPW := slices.Contains(s.Env, "WEED_POSTGRES_PASSWORD="+secret)
		if hasPW != (s.Name == "filer") {
			t.Errorf("%s env = %q: only the filer gets the password", s.Name, s.Env)
		}
	}
	if !slices.Equal(names, []string{"master", "volume", "filer"}) {
		t.Errorf("servers = %q, want master, volume, filer in that order", names)
	}
	if !slices.Contains(servers[2].Args, "-port.grpc=28888") || !strings.HasSuffix(servers[2].ReadyURL, ":18888/") {
		t.Errorf("filer: argv %q, ready URL %s", servers[2].Args, servers[2].ReadyURL)
	}

	// An older file with a looser mode is tightened.
	if err := os.MkdirAll(filepath.Dir(l.FilerConfigPath()), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.FilerConfigPath(), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := l.Prepare(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(l.FilerConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("filer.toml mode %v, want 0600", fi.Mode().Perm())
	}
	b, _ := os.ReadFile(l.FilerConfigPath())
	conf := string(b)
	if strings.Contains(conf, secret) {
		t.Error("filer.toml holds the Postgres password")
	}
	for _, want := range []string{`database = "seaweedfs"`, "port = 5432", `username = "levers9"`, "createTable = true"} {
		if !strings.Contains(conf, want) {
			t.Errorf("filer.toml lacks %q:\n%s", want, conf)
		}
	}
	for _, d := range []string{"logs", "master", "volume", "filer"} {
		if fi, err := os.Stat(filepath.Join(dir, d)); err != nil || !fi.IsDir() {
			t.Errorf("Prepare did not make %s: %v", d, err)
		}
	}

	if _, err := seaweed.NewLayout(seaweed.ClusterOptions{Dir: dir}); err == nil {
		t.Error("NewLayout without a weed binary: no error")
	}
}

// TestWaitReadyWantsSeaweedFS: an answer on the ready URL counts only when
// it comes from SeaweedFS; another program that took the port (net/http's
// plain 404) does not, and a filer refusing a token (JSON 401) does.
func TestWaitReadyWantsSeaweedFS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		ready   bool
	}{
		{"another program", http.NotFound, false},
		{"filer refusing a token", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"wrong jwt"}`))
		}, true},
		{"volume server", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Server", "SeaweedFS Volume 30GB 4.53")
			_, _ = w.Write([]byte("ok"))
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			err := seaweed.WaitReady(context.Background(), seaweed.Server{Name: "filer", ReadyURL: srv.URL + "/"}, 500*time.Millisecond, nil)
			if tc.ready != (err == nil) {
				t.Fatalf("ready=%v, err=%v", tc.ready, err)
			}
			if err != nil && !strings.Contains(err.Error(), "not as SeaweedFS") {
				t.Fatalf("error does not say why: %v", err)
			}
		})
	}
}
