package recipe

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tree makes a small source directory and returns its path.
func tree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"main.py":         "print('hi')\n",
		"pkg/__init__.py": "",
		"pkg/a.txt":       "aaa",
		"pkg.txt":         "sorted after pkg/",
		"z/deep/x":        strings.Repeat("x", 3000),
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "main.py"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../main.py", filepath.Join(dir, "pkg", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "outside")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func tarOf(t *testing.T, src string) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	d, n, err := TarSource(context.Background(), src, &buf, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	if want := "sha256:" + hex.EncodeToString(sum[:]); d != want || n != int64(buf.Len()) {
		t.Fatalf("TarSource returned %s %d, wrote %s %d", d, n, want, buf.Len())
	}
	return d, buf.Bytes()
}

func TestTarSourceContent(t *testing.T) {
	t.Parallel()
	_, b := tarOf(t, tree(t))
	type entry struct {
		name string
		typ  byte
		mode int64
		link string
	}
	var got []entry
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: uid %d gid %d uname %q gname %q mtime %v", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime)
		}
		got = append(got, entry{h.Name, h.Typeflag, h.Mode, h.Linkname})
	}
	want := []entry{
		{"main.py", tar.TypeReg, 0o755, ""},
		{"outside", tar.TypeSymlink, 0o777, "/etc/passwd"},
		{"pkg/", tar.TypeDir, 0o755, ""},
		{"pkg/__init__.py", tar.TypeReg, 0o644, ""},
		{"pkg/a.txt", tar.TypeReg, 0o644, ""},
		{"pkg/link", tar.TypeSymlink, 0o777, "../main.py"},
		{"pkg.txt", tar.TypeReg, 0o644, ""},
		{"z/", tar.TypeDir, 0o755, ""},
		{"z/deep/", tar.TypeDir, 0o755, ""},
		{"z/deep/x", tar.TypeReg, 0o644, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("entries:\n got %v\nwant %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestTarSourceDeterministic(t *testing.T) {
	t.Parallel()
	dir := tree(t)
	d1, _ := tarOf(t, dir)
	d2, _ := tarOf(t, dir)
	if d1 != d2 {
		t.Fatalf("two runs: %s, %s", d1, d2)
	}

	// Other times on disk: same digest.
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, p := range []string{"main.py", "pkg", "pkg/a.txt", "z/deep"} {
		if err := os.Chtimes(filepath.Join(dir, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if d3, _ := tarOf(t, dir); d3 != d1 {
		t.Fatalf("mtimes changed the digest: %s, %s", d1, d3)
	}

	// Another copy of the same tree elsewhere: same digest.
	if d4, _ := tarOf(t, tree(t)); d4 != d1 {
		t.Fatalf("an equal tree gave %s, want %s", d4, d1)
	}

	// One byte changed: another digest.
	if err := os.WriteFile(filepath.Join(dir, "pkg", "a.txt"), []byte("aab"), 0o644); err != nil {
		t.Fatal(err)
	}
	if d5, _ := tarOf(t, dir); d5 == d1 {
		t.Fatal("changing a byte kept the digest")
	}

	// A mode changed: another digest.
	if err := os.Chmod(filepath.Join(dir, "pkg.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	d6, _ := tarOf(t, dir)
	if err := os.Chmod(filepath.Join(dir, "pkg.txt"), 0o644); err != nil {
		t.Fatal(err)
	}
	if d7, _ := tarOf(t, dir); d6 == d7 {
		t.Fatal("changing a mode kept the digest")
	}
}

func TestTarSourceSingleFile(t *testing.T) {
	t.Parallel()
	dir := tree(t)
	_, b := tarOf(t, filepath.Join(dir, "pkg", "a.txt"))
	tr := tar.NewReader(bytes.NewReader(b))
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(tr)
	if h.Name != "a.txt" || h.Typeflag != tar.TypeReg || string(body) != "aaa" {
		t.Fatalf("entry %q type %c body %q", h.Name, h.Typeflag, body)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Fatalf("more than one entry: %v", err)
	}
	// A symlink given as src is kept, not followed.
	_, b = tarOf(t, filepath.Join(dir, "pkg", "link"))
	h, err = tar.NewReader(bytes.NewReader(b)).Next()
	if err != nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "../main.py" {
		t.Fatalf("symlink src: %+v %v", h, err)
	}
}

func TestTarSourceRefuses(t *testing.T) {
	t.Parallel()
	dir := tree(t)
	fifo := filepath.Join(dir, "pkg", "pipe")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	small := t.TempDir()
	if err := os.WriteFile(filepath.Join(small, "f"), make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		src    string
		max    int64
		want   string
		tooBig bool
	}{
		{"fifo in a directory", dir, 1 << 20, fifo + ": a fifo not supported", false},
		{"fifo as src", fifo, 1 << 20, "a fifo", false},
		{"missing", filepath.Join(dir, "nope"), 1 << 20, "no such file", false},
		{"no limit", small, 0, "maxBytes must be positive", false},
		{"file larger than max", small, 999, "more than 999 bytes", true},
		{"tar larger than max", small, 2000, "more than 2000 bytes", true}, // 512 header + 1024 body + 1024 trailer
		{"fits", small, 2560, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			_, n, err := TarSource(context.Background(), tt.src, &buf, tt.max)
			if tt.want == "" {
				if err != nil || n != 2560 {
					t.Fatalf("TarSource: %d, %v", n, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("TarSource: %v, want an error containing %q", err, tt.want)
			}
			if errors.Is(err, ErrTooLarge) != tt.tooBig {
				t.Fatalf("errors.Is(ErrTooLarge) = %v", !tt.tooBig)
			}
			if tt.max > 0 && int64(buf.Len()) > tt.max {
				t.Fatalf("wrote %d bytes, more than %d", buf.Len(), tt.max)
			}
		})
	}
}

func TestTarSourceCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := TarSource(ctx, tree(t), io.Discard, 1<<20); !errors.Is(err, context.Canceled) {
		t.Fatalf("TarSource: %v, want context.Canceled", err)
	}
}
