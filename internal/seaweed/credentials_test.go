package seaweed_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
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

// secretVolume lays out files as kubelet mounts a Secret: each name a
// symlink through ..data into a timestamped directory, and each file
// 0440, as a pod with an fsGroup gets it whatever its defaultMode.
func secretVolume(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	ts := filepath.Join(dir, "..2026_12_05_00_00_00.000000001")
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(ts, name), b, 0o440); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCopySecurity: credentials mounted from a Kubernetes Secret (0440
// through symlinks), which LoadSecurity refuses as they are, load once
// copied; the copy is the caller's, 0600 in a 0700 directory, again on a
// second run (an init container runs again when its pod restarts), and
// leaves the CA's key behind. A missing file is named.
func TestCopySecurity(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "sec")
	want, err := seaweed.EnsureSecurity(src)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, f := range append(seaweed.SecurityFiles(), "ca.key") {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = b
	}
	mounted := secretVolume(t, files)
	if _, err := seaweed.LoadSecurity(mounted); err == nil || !strings.Contains(err.Error(), "mode -r--r-----") {
		t.Fatalf("LoadSecurity of the Secret as mounted: %v, want its 0440 keys refused", err)
	}
	dst := filepath.Join(t.TempDir(), "emptydir", "security")
	for run := range 2 {
		got, err := seaweed.CopySecurity(mounted, dst)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		if got.VolumeReadKey != want.VolumeReadKey || got.FilerWriteKey != want.FilerWriteKey || got.Dir != dst {
			t.Fatalf("run %d: the copy's keys differ from the source's", run)
		}
	}
	if st, err := os.Stat(dst); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, want a 0700 directory", dst, err)
	}
	for _, f := range seaweed.SecurityFiles() {
		st, err := os.Lstat(filepath.Join(dst, f))
		if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 || int(st.Sys().(*syscall.Stat_t).Uid) != os.Getuid() {
			t.Errorf("%s: %v (%v), want a 0600 file of ours", f, err, st)
		}
	}
	if _, err := os.Lstat(filepath.Join(dst, "ca.key")); !os.IsNotExist(err) {
		t.Errorf("the CA's key was copied: %v", err)
	}

	delete(files, "client.key")
	_, err = seaweed.CopySecurity(secretVolume(t, files), filepath.Join(t.TempDir(), "security"))
	if err == nil || !strings.Contains(err.Error(), "client.key") {
		t.Fatalf("CopySecurity without client.key: %v, want it named", err)
	}
	if strings.Contains(err.Error(), want.FilerReadKey) || strings.Contains(err.Error(), "PRIVATE KEY") {
		t.Fatal("the error holds a key")
	}
}
