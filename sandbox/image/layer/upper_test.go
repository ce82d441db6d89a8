package layer_test

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image/layer"
)

// stepUpper builds a fresh lower directory, mounts an overlay over it, runs
// buildStep in the merged view and returns the upper directory.
func stepUpper(t *testing.T, reversed bool) string {
	t.Helper()
	lower := t.TempDir()
	writeTree(t, lower, lowerFiles)
	merged, upper := mountOverlay(t, lower)
	buildStep(t, merged, reversed)
	return upper
}

func fromUpper(t *testing.T, upper string, opts layer.Options) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := layer.FromUpper(context.Background(), upper, &buf, opts); err != nil {
		t.Fatalf("FromUpper: %v", err)
	}
	return buf.Bytes()
}

func TestFromUpperEntries(t *testing.T) {
	requireRoot(t)
	upper := stepUpper(t, false)
	got := readTar(t, fromUpper(t, upper, layer.Options{Exclude: excludes}))
	capXattr := map[string]string{"security.capability": string(capNetRaw())}
	want := []entry{
		{Name: ".wh.gone.txt", Type: tar.TypeReg, Mode: 0},
		{Name: "bin/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "bin/tool", Type: tar.TypeReg, Mode: 0o4755, Data: "tool\n", Xattrs: capXattr},
		{Name: "data/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "data/.wh..wh..opq", Type: tar.TypeReg, Mode: 0},
		{Name: "data/fresh", Type: tar.TypeReg, Mode: 0o644, Data: "fresh\n"},
		{Name: "etc/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "etc/config", Type: tar.TypeReg, Mode: 0o644, Data: "new\n"},
		{Name: "keep/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "keep/a", Type: tar.TypeReg, Mode: 0o600, Data: "a\n"},
		{Name: "keep/b", Type: tar.TypeReg, Mode: 0o644, Uid: 1000, Gid: 1000, Data: "b\n"},
		{Name: "links/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "links/one", Type: tar.TypeReg, Mode: 0o644, Data: "one\n"},
		{Name: "links/sym", Type: tar.TypeSymlink, Mode: 0o777, Link: "one"},
		{Name: "links/two", Type: tar.TypeLink, Mode: 0o644, Link: "links/one"},
		{Name: "new.txt", Type: tar.TypeReg, Mode: 0o644, Data: "hello\n", Xattrs: map[string]string{"user.foo": "bar"}},
		{Name: "run/", Type: tar.TypeDir, Mode: 0o755},
	}
	if d := diffEntries(got, want); d != "" {
		t.Fatalf("FromUpper entries differ:\n%s\ngot names %q", d, names(got))
	}
	epoch := time.Unix(0, 0)
	for _, e := range got {
		for i, tm := range e.times {
			if !tm.Equal(epoch) {
				t.Errorf("%s: time %d is %v, want Unix 0", e.Name, i, tm)
			}
		}
		if e.uname != "" {
			t.Errorf("%s: uname/gname %q, want empty", e.Name, e.uname)
		}
	}

	// The upper really holds what was left out, and overlay's bookkeeping.
	for _, p := range []string{"run/levers9/secret", "etc/resolv.conf"} {
		if _, err := os.Lstat(filepath.Join(upper, p)); err != nil {
			t.Errorf("upper should hold excluded %s: %v", p, err)
		}
	}
	if v, err := getxattr(filepath.Join(upper, "data"), "trusted.overlay.opaque"); err != nil || v != "y" {
		t.Errorf("upper data/ opaque xattr = %q, %v; want y", v, err)
	}
}

func getxattr(p, name string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func TestFromUpperEpochOption(t *testing.T) {
	requireRoot(t)
	upper := stepUpper(t, false)
	sde := time.Date(2024, 5, 1, 12, 0, 0, 500, time.FixedZone("x", 3600))
	got := readTar(t, fromUpper(t, upper, layer.Options{Exclude: excludes, Epoch: sde}))
	want := sde.Truncate(time.Second)
	for _, e := range got {
		for i, tm := range e.times {
			if !tm.Equal(want) {
				t.Fatalf("%s: time %d is %v, want %v", e.Name, i, tm, want)
			}
		}
	}
}

// TestFromUpperReproducible: the same step in two fresh overlays, the
// second in another order, with other file times and other inodes, gives
// byte-identical tars, equal layer digests and equal image digests.
func TestFromUpperReproducible(t *testing.T) {
	requireRoot(t)
	upperA := stepUpper(t, false)
	upperB := stepUpper(t, true)
	later := time.Now().Add(36 * time.Hour)
	ts := []unix.Timespec{unix.NsecToTimespec(later.UnixNano()), unix.NsecToTimespec(later.UnixNano())}
	err := filepath.WalkDir(upperB, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
	if err != nil {
		t.Fatal(err)
	}
	opts := layer.Options{Exclude: excludes}
	a, b := fromUpper(t, upperA, opts), fromUpper(t, upperB, opts)
	if !bytes.Equal(a, b) {
		t.Fatalf("tars differ (%d vs %d bytes):\n%s", len(a), len(b), diffEntries(readTar(t, b), readTar(t, a)))
	}
	dir := t.TempDir()
	pa, pb := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	if err := os.WriteFile(pa, a, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pb, b, 0o600); err != nil {
		t.Fatal(err)
	}
	la, err := layer.Layer(pa)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := layer.Layer(pb)
	if err != nil {
		t.Fatal(err)
	}
	da, _ := la.Digest()
	db, _ := lb.Digest()
	if da != db {
		t.Fatalf("layer digests differ: %s vs %s", da, db)
	}
	step := func(l layer.AppendStep) []layer.AppendStep {
		return []layer.AppendStep{l, {Config: layer.ConfigChange{Env: map[string]string{"B": "2", "A": "1"}, Workdir: "/app"}, CreatedBy: "env A=1 B=2"}}
	}
	ia, err := layer.Append(empty.Image, step(layer.AppendStep{Layer: la, CreatedBy: "run make"}))
	if err != nil {
		t.Fatal(err)
	}
	ib, err := layer.Append(empty.Image, step(layer.AppendStep{Layer: lb, CreatedBy: "run make"}))
	if err != nil {
		t.Fatal(err)
	}
	ha, _ := ia.Digest()
	hb, _ := ib.Digest()
	if ha != hb {
		t.Fatalf("image digests differ: %s vs %s", ha, hb)
	}
	t.Logf("tar %d bytes, layer %s, image %s", len(a), da, ha)
}

func TestFromUpperRefuses(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name string
		make func(t *testing.T, upper string)
		opts layer.Options
		want string
	}{
		{"device node", func(t *testing.T, upper string) {
			if err := os.Mkdir(filepath.Join(upper, "dev2"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mknod(filepath.Join(upper, "dev2/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
		}, layer.Options{}, `"/dev2/null": device node 1:3`},
		{"block device", func(t *testing.T, upper string) {
			if err := unix.Mknod(filepath.Join(upper, "blk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))); err != nil {
				t.Fatal(err)
			}
		}, layer.Options{}, `"/blk": device node 7:0`},
		{"whiteout-like name", func(t *testing.T, upper string) {
			if err := os.WriteFile(filepath.Join(upper, ".wh.x"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, layer.Options{}, `"/.wh.x": the name is reserved`},
		{"overlay redirect", func(t *testing.T, upper string) {
			if err := os.Mkdir(filepath.Join(upper, "moved"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := unix.Setxattr(filepath.Join(upper, "moved"), "trusted.overlay.redirect", []byte("/orig"), 0); err != nil {
				t.Fatal(err)
			}
		}, layer.Options{}, `"/moved" carries overlay's redirect xattr`},
		{"relative exclude", func(t *testing.T, upper string) {}, layer.Options{Exclude: []string{"/proc", "etc/hosts"}}, `exclude[1] "etc/hosts": not an absolute path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upper := t.TempDir()
			tc.make(t, upper)
			err := layer.FromUpper(context.Background(), upper, &bytes.Buffer{}, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("FromUpper error = %v, want one containing %s", err, tc.want)
			}
		})
	}
	// An excluded device is left out, not refused.
	upper := t.TempDir()
	if err := os.Mkdir(filepath.Join(upper, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(upper, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if got := readTar(t, fromUpper(t, upper, layer.Options{Exclude: excludes})); len(got) != 0 {
		t.Fatalf("excluded /dev gave entries %q", names(got))
	}
	if !errdefs.IsInvalidArgument(layer.FromUpper(context.Background(), upper, &bytes.Buffer{}, layer.Options{Exclude: []string{"dev"}})) {
		t.Fatal("relative exclude: want ErrInvalidArgument")
	}
}

// TestFromUpperNeverFollows: symlinks in the upper directory are entries,
// never paths to read through, even to a directory or out of the upper.
func TestFromUpperNeverFollows(t *testing.T) {
	requireRoot(t)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	upper := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(upper, "evil")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../"+filepath.Base(outside)+"/secret", filepath.Join(upper, "rel")); err != nil {
		t.Fatal(err)
	}
	b := fromUpper(t, upper, layer.Options{})
	if bytes.Contains(b, []byte("host secret")) {
		t.Fatal("the tar holds a file read through a symlink")
	}
	got := readTar(t, b)
	if len(got) != 2 || got[0].Name != "evil" || got[0].Type != tar.TypeSymlink || got[0].Link != outside || got[1].Name != "rel" {
		t.Fatalf("entries %v", got)
	}
}

// TestFromUpperContext: a cancelled context stops the walk.
func TestFromUpperContext(t *testing.T) {
	upper := t.TempDir()
	if err := os.WriteFile(filepath.Join(upper, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := layer.FromUpper(ctx, upper, &bytes.Buffer{}, layer.Options{}); err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("err = %v, want context canceled", err)
	}
}
