package secretfile

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// setup prepares dir and returns the path to write.
		setup func(t *testing.T, dir string) string
	}{
		{
			name:  "new file in existing dir",
			setup: func(t *testing.T, dir string) string { return filepath.Join(dir, "key.pem") },
		},
		{
			name:  "missing parents are created 0700",
			setup: func(t *testing.T, dir string) string { return filepath.Join(dir, "a", "b", "key.pem") },
		},
		{
			name: "existing looser file becomes 0600",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "token")
				if err := os.WriteFile(p, []byte("old, longer contents"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(p, 0o666); err != nil {
					t.Fatal(err)
				}
				return p
			},
		},
		{
			name: "existing directory keeps its mode",
			setup: func(t *testing.T, dir string) string {
				d := filepath.Join(dir, "shared")
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(d, 0o755); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(d, "key.pem")
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			p := tc.setup(t, dir)
			// An existing directory keeps its mode; a created one is 0700.
			wantDir := os.FileMode(0o700)
			if st, err := os.Stat(filepath.Dir(p)); err == nil {
				wantDir = st.Mode().Perm()
			}
			want := []byte("secret\n")
			if err := Write(p, want); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("contents %q, %v; want %q", got, err, want)
			}
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("file mode %v, want 0600", st.Mode().Perm())
			}
			dst, err := os.Stat(filepath.Dir(p))
			if err != nil {
				t.Fatal(err)
			}
			if dst.Mode().Perm() != wantDir {
				t.Errorf("dir mode %v, want %v", dst.Mode().Perm(), wantDir)
			}
			assertNoTemps(t, filepath.Dir(p))
		})
	}
}

// TestWriteReplacesAtomically: a file open before the write keeps the old
// contents (the new file is a new inode renamed over the path), and a failed
// write leaves the old file as it was.
func TestWriteReplacesAtomically(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "agent.json")
	if err := Write(p, []byte("v1")); err != nil {
		t.Fatal(err)
	}
	old, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := Write(p, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	var buf [8]byte
	n, _ := old.Read(buf[:])
	if string(buf[:n]) != "v1" {
		t.Errorf("reader open before the write saw %q, want v1", buf[:n])
	}
	if got, _ := os.ReadFile(p); string(got) != "v2" {
		t.Errorf("after write: %q, want v2", got)
	}

	// Writing over a directory fails at the rename and leaves it alone.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "keep"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(sub, []byte("x")); err == nil {
		t.Error("write over a non-empty directory succeeded")
	}
	if st, err := os.Stat(sub); err != nil || !st.IsDir() {
		t.Errorf("directory replaced: %v %v", st, err)
	}
	assertNoTemps(t, dir)
}

// TestWriteParentIsFile: a parent that is a regular file is an error naming
// it, not a panic or a stray temp file.
func TestWriteParentIsFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f := filepath.Join(dir, "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(filepath.Join(f, "key.pem"), []byte("k")); err == nil {
		t.Fatal("write under a regular file succeeded")
	}
	assertNoTemps(t, dir)
}

func assertNoTemps(t *testing.T, dir string) {
	t.Helper()
	left, err := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	if err != nil || len(left) > 0 {
		t.Errorf("temporary files left behind: %v %v", left, err)
	}
}
