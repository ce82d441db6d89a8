package seaweed_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/seaweed"
)

// TestEnsureSecurity checks the credentials are made once and kept, that
// a loose or missing file is named (never its content), and that mount
// credentials survive their trip as KEY=VALUE into 0600 files.
func TestEnsureSecurity(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "sec")
	s1, err := seaweed.EnsureSecurity(dir)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := seaweed.EnsureSecurity(dir)
	if err != nil {
		t.Fatal(err)
	}
	if *s1 != *s2 {
		t.Fatal("a second EnsureSecurity made new keys")
	}
	keys := []string{s1.VolumeWriteKey, s1.VolumeReadKey, s1.FilerWriteKey, s1.FilerReadKey}
	for i, k := range keys {
		if len(k) < 32 || slices.Contains(keys[:i], k) {
			t.Fatalf("key %d is short or repeated", i)
		}
	}
	conf := s1.ServerConfig("master", []string{"127.0.0.1"})
	if !strings.Contains(conf, s1.VolumeWriteKey) || strings.Contains(conf, s1.FilerWriteKey) || !strings.Contains(conf, `white_list = "127.0.0.1"`) {
		t.Errorf("master's security.toml:\n%s", conf)
	}
	if conf := s1.ServerConfig("filer", nil); !strings.Contains(conf, s1.FilerReadKey) || !strings.Contains(conf, `allowed_commonNames = "master,volume,filer,client"`) {
		t.Errorf("filer's security.toml:\n%s", conf)
	}

	mc, err := s1.MountCredentials()
	if err != nil {
		t.Fatal(err)
	}
	got, rest := seaweed.SplitMountEnv(append(mc.Env(), "WEED_OTHER=1"))
	if got.VolumeReadKey != mc.VolumeReadKey || string(got.KeyPEM) != string(mc.KeyPEM) || !slices.Equal(rest, []string{"WEED_OTHER=1"}) {
		t.Fatalf("SplitMountEnv lost something: rest %q", rest)
	}
	mdir := filepath.Join(t.TempDir(), "mount")
	if err := got.WriteMountConfig(mdir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.crt", "client.crt", "client.key", "security.toml"} {
		st, err := os.Stat(filepath.Join(mdir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, want 0600", f, err)
		}
	}
	if err := (seaweed.MountCredentials{VolumeReadKey: "k"}).WriteMountConfig(t.TempDir()); err == nil || strings.Contains(err.Error(), "k\"") {
		t.Errorf("incomplete credentials: %v", err)
	}

	if err := os.Chmod(filepath.Join(dir, "jwt-filer-read.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "client.key")); err != nil {
		t.Fatal(err)
	}
	_, err = seaweed.LoadSecurity(dir)
	if err == nil || !strings.Contains(err.Error(), "jwt-filer-read.key: mode -rw-r--r--") || !strings.Contains(err.Error(), "client.key") {
		t.Fatalf("LoadSecurity of a loose dir: %v", err)
	}
	if strings.Contains(err.Error(), s1.FilerReadKey) {
		t.Fatal("the error holds a key")
	}
}
