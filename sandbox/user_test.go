package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
)

func TestResolveUser(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1234:1300::/home/app:/bin/sh\nbroken:x:abc:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nstaff:x:50:app\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user     string
		uid, gid uint32
		wantErr  bool
	}{
		{"", 0, 0, false},
		{"0", 0, 0, false},
		{"1000", 1000, 1000, false},
		{"1000:50", 1000, 50, false},
		{"app", 1234, 1300, false},
		{"app:staff", 1234, 50, false},
		{"1000:staff", 1000, 50, false},
		{"nobody", 0, 0, true},
		{"app:nogroup", 0, 0, true},
		{"broken", 0, 0, true},
		{":50", 0, 0, true},
	} {
		uid, gid, err := resolveUser(root, tc.user)
		if (err != nil) != tc.wantErr || uid != tc.uid || gid != tc.gid {
			t.Errorf("%q: %d:%d %v", tc.user, uid, gid, err)
		}
	}
}

// TestResolveUserStaysInRoot: an image whose /etc/passwd is an absolute
// symlink to a host file must not make the agent read the host's file.
func TestResolveUserStaysInRoot(t *testing.T) {
	dir := t.TempDir()
	host := filepath.Join(dir, "host-passwd")
	if err := os.WriteFile(host, []byte("evil:x:0:0::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(root, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := resolveUser(root, "evil"); err == nil {
		t.Fatal("resolved a user from the host's file through a symlink")
	}
	if err := os.Symlink("../../../../../../.."+host, filepath.Join(root, "etc/group")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := resolveUser(root, "0:evil"); err == nil {
		t.Fatal("resolved a group through a .. symlink")
	}
	task := TaskSpec{ID: "u", Rootfs: root, Args: []string{"true"}, User: "evil"}
	if _, _, err := BuildSpec(task, Security{}.WithDefaults(), goldenHost()); !errdefs.IsInvalidArgument(err) {
		t.Errorf("BuildSpec with an unresolvable user: %v", err)
	}
}
