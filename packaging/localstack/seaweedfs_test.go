package localstack

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/levers9/levers9/controlplane/config"
)

func TestVolumesEnabled(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{"": true, "1": true, "yes": true, "0": false, "false": false, "OFF": false, " no ": false} {
		if got := volumesEnabled(func(string) string { return v }); got != want {
			t.Errorf("%s=%q: enabled %v, want %v", VolumesEnv, v, got, want)
		}
	}
}

// TestSeaweedConfig: the local cluster uses the remembered ports and the
// stack's Postgres (database seaweedfs) with the password only in the
// filer's environment, and its filer lands in the controlplane config
// (0600, accepted by the controlplane's loader); with volumes off the
// config has no volumes key.
func TestSeaweedConfig(t *testing.T) {
	t.Parallel()
	p := NewPaths(t.TempDir())
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	st := &State{
		PostgresPort: 15432, PostgresPassword: "pg-secret-0123", RedisPort: 16379, RedisPassword: "r",
		EncryptionKey: strings.Repeat("ab", 32), BootstrapSecret: strings.Repeat("b", 48), GRPCPort: 1, RESTPort: 2, TunnelPort: 3, MetricsPort: 4,
		DemoImage: "127.0.0.1:5000/levers9/demo:latest",
		SeaweedFS: &SeaweedPorts{Master: 21001, MasterGRPC: 21002, Volume: 21003, VolumeGRPC: 21004, Filer: 21005, FilerGRPC: 21006},
	}
	l, err := seaweedLayout(p, st, "/opt/weed")
	if err != nil {
		t.Fatal(err)
	}
	o := l.Options()
	if o.Dir != filepath.Join(p.Dir, "seaweedfs") || o.Postgres.Port != 15432 || o.Postgres.Database != seaweedDatabase || o.Host != "127.0.0.1" {
		t.Errorf("layout options: %+v", o)
	}
	if got, want := l.FilerAddr(), "127.0.0.1:21005.21006"; got != want {
		t.Errorf("filer address %q, want %q", got, want)
	}
	for _, s := range l.Servers() {
		if strings.Contains(strings.Join(s.Args, " "), st.PostgresPassword) {
			t.Errorf("%s argv holds the Postgres password", s.Name)
		}
		if s.Name == "filer" && !slices.Contains(s.Env, "WEED_POSTGRES_PASSWORD="+st.PostgresPassword) {
			t.Errorf("filer env %q lacks the password", s.Env)
		}
	}

	// A cluster from before credentials is not taken as secured.
	if seaweedSecured(l) {
		t.Error("a cluster without security.toml files counts as secured")
	}
	if err := l.Prepare(); err != nil {
		t.Fatal(err)
	}
	if !seaweedSecured(l) {
		t.Error("a prepared cluster does not count as secured")
	}
	quiet := func(string, ...any) {}
	if _, _, err := writeControlplaneConfig(p, st, l, quiet); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p.file("controlplane.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("controlplane.yaml mode %v, want 0600", fi.Mode().Perm())
	}
	cfg := loadConfig(t, p)
	if sw := cfg.Volumes.SeaweedFS; sw.FilerAddr != "127.0.0.1:21005.21006" || sw.FilerURL != "http://127.0.0.1:21005" || sw.SecurityDir != l.SecurityDir() {
		t.Errorf("volumes.seaweedfs = %+v", sw)
	}

	_, changed, err := writeControlplaneConfig(p, st, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if !changed {
		t.Error("turning volumes off did not change the config")
	}
	if cfg := loadConfig(t, p); cfg.Volumes.SeaweedFS.FilerAddr != "" {
		t.Errorf("volumes off, yet volumes.seaweedfs = %+v", cfg.Volumes.SeaweedFS)
	}
}

func loadConfig(t *testing.T, p Paths) *config.Config {
	t.Helper()
	f, err := os.Open(p.file("controlplane.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := config.Load(f, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestAgentWeedFlag: the agents get --weed when volumes are on, and the
// flags live in a file of their own beside the pid file (not one a pool
// glob takes for an agent).
func TestAgentWeedFlag(t *testing.T) {
	t.Parallel()
	p := NewPaths("/src")
	a := p.agentFor("gpu", 1)
	a.args = make([]string, 0, 4)
	withWeed := a.withWeed("/cache/weed")
	if !slices.Equal(withWeed.args, []string{"--weed", "/cache/weed"}) || len(a.args) != 0 {
		t.Errorf("withWeed: %q (the original now %q)", withWeed.args, a.args)
	}
	if got := p.agentFor("gpu", 1).withWeed("").args; len(got) != 0 {
		t.Errorf("withWeed(\"\") = %q", got)
	}
	if got, want := a.argsFile(), "/src/.levers9-dev/agent-gpu.args"; got != want {
		t.Errorf("argsFile = %s, want %s", got, want)
	}
	if got, want := p.agentFor("default", 0).argsFile(), "/src/.levers9-dev/agent.args"; got != want {
		t.Errorf("argsFile = %s, want %s", got, want)
	}
}

func TestIsWeedMountUnder(t *testing.T) {
	t.Parallel()
	dir := "/src/.levers9-dev"
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"/cache/weed", "mount", "-filer=127.0.0.1:1.2", "-dir=/src/.levers9-dev/agent/state/volumes/mnt/v1-rw"}, true},
		{[]string{"weed", "-v=1", "mount", "-dir", "/src/.levers9-dev/agent-gpu/state/volumes/mnt/v2-ro"}, true},
		// Another checkout's mount, a server of this stack, another program.
		{[]string{"/cache/weed", "mount", "-dir=/other/.levers9-dev/agent/state/volumes/mnt/v1-rw"}, false},
		{[]string{"/cache/weed", "mount", "-dir=/src/.levers9-dev-old/x"}, false},
		{[]string{"/cache/weed", "filer", "-dir=/src/.levers9-dev/seaweedfs/filer"}, false},
		{[]string{"/bin/sh", "mount", "-dir=/src/.levers9-dev/x"}, false},
	} {
		cmdline := []byte(strings.Join(tc.args, "\x00") + "\x00")
		if got := isWeedMountUnder(cmdline, dir); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.args, got, tc.want)
		}
	}
}
