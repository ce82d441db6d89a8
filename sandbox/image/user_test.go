package image_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image"
)

func TestResolveUser(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n# comment\nbroken:x:zz:1\n",
		"etc/group":  "root:x:0:\napp:x:1001:\nvideo:x:44:app,other\naudio:x:29:other\n",
	}
	for p, data := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A hostile image pointing /etc/shadow-like links at the host changes
	// nothing: ReadFile resolves inside root.
	if err := os.Symlink("/etc/hostname", filepath.Join(root, "etc/hostlink")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		spec    string
		want    image.User
		wantErr bool
	}{
		{spec: "", want: image.User{}},
		{spec: "root", want: image.User{}},
		{spec: "app", want: image.User{UID: 1000, GID: 1001, AdditionalGIDs: []uint32{44}}},
		{spec: "1000", want: image.User{UID: 1000, GID: 1001, AdditionalGIDs: []uint32{44}}},
		{spec: "app:video", want: image.User{UID: 1000, GID: 44}},
		{spec: "4242", want: image.User{UID: 4242}},
		{spec: "4242:7", want: image.User{UID: 4242, GID: 7}},
		{spec: "nobody", wantErr: true},
		{spec: "app:nogroup", wantErr: true},
		{spec: ":1", wantErr: true},
		{spec: "app:", wantErr: true},
		{spec: "4294967295", wantErr: true},
	}
	for _, tt := range tests {
		got, err := image.ResolveUser(root, tt.spec)
		if tt.wantErr {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("ResolveUser(%q) = %+v, %v; want invalid argument", tt.spec, got, err)
			}
			continue
		}
		if err != nil || got.UID != tt.want.UID || got.GID != tt.want.GID || !slices.Equal(got.AdditionalGIDs, tt.want.AdditionalGIDs) {
			t.Errorf("ResolveUser(%q) = %+v, %v; want %+v", tt.spec, got, err, tt.want)
		}
	}
	if b, err := image.ReadFile(root, "/etc/hostlink", 1<<10); err == nil {
		t.Errorf("ReadFile followed an absolute link to the host: %q", b)
	}
}

// FuzzResolveUser feeds arbitrary account files and user specs: no panic,
// and a numeric uid that resolves always keeps its number.
func FuzzResolveUser(f *testing.F) {
	f.Add("root:x:0:0::/:/bin/sh\n", "root:x:0:\n", "root")
	f.Add("a:x:1:2\n::::\n", "g:x:3:a,a\n", "1:g")
	f.Add("x", "y", "::")
	f.Fuzz(func(t *testing.T, passwd, group, spec string) {
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(filepath.Join(root, "etc/passwd"), []byte(passwd), 0o644)
		_ = os.WriteFile(filepath.Join(root, "etc/group"), []byte(group), 0o644)
		u, err := image.ResolveUser(root, spec)
		if err != nil {
			return
		}
		var n uint32
		if _, scanErr := fmt.Sscanf(spec, "%d", &n); scanErr == nil && fmt.Sprint(n) == spec && u.UID != n {
			t.Fatalf("ResolveUser(%q) uid = %d", spec, u.UID)
		}
	})
}
