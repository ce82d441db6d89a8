package layer_test

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/imagetest"
)

// mountSource names this package's overlay mounts (manual ones and the
// image store's) so TestMain can remove what a killed run left.
const mountSource = "l9l-test"

// excludes are the sandbox's mount points, as a build would pass them.
var excludes = []string{"/proc", "/sys", "/dev", "/etc/resolv.conf", "/etc/hosts", "/etc/hostname", "/run/levers9"}

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		if err := imagetest.ReconcileMounts(mountSource); err != nil {
			fmt.Fprintln(os.Stderr, "reconcile:", err)
		}
	}
	os.Exit(m.Run())
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root: the test mounts overlayfs, chowns files and reads trusted.overlay.* xattrs")
	}
}

// lowerFiles is the base image's tree, both as a tar layer and on disk.
var lowerFiles = []build.File{
	{Path: "bin", Type: tar.TypeDir, Mode: 0o755},
	{Path: "bin/tool", Mode: 0o755, Data: []byte("tool\n")},
	{Path: "data", Type: tar.TypeDir, Mode: 0o755},
	{Path: "data/old1", Mode: 0o644, Data: []byte("1\n")},
	{Path: "data/sub", Type: tar.TypeDir, Mode: 0o755},
	{Path: "data/sub/old2", Mode: 0o644, Data: []byte("2\n")},
	{Path: "etc", Type: tar.TypeDir, Mode: 0o755},
	{Path: "etc/config", Mode: 0o644, Data: []byte("old\n")},
	{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\n")},
	{Path: "gone.txt", Mode: 0o644, Data: []byte("bye\n")},
	{Path: "keep", Type: tar.TypeDir, Mode: 0o755},
	{Path: "keep/a", Mode: 0o644, Data: []byte("a\n")},
	{Path: "keep/b", Mode: 0o644, Data: []byte("b\n")},
	{Path: "run", Type: tar.TypeDir, Mode: 0o755},
	{Path: "tmp", Type: tar.TypeDir, Mode: 0o1777},
}

// writeTree materialises files under dir (as root: owners applied).
func writeTree(t *testing.T, dir string, files []build.File) {
	t.Helper()
	for _, f := range files {
		p := filepath.Join(dir, f.Path)
		switch f.Type {
		case tar.TypeDir:
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		default:
			if err := os.WriteFile(p, f.Data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Lchown(p, f.Uid, f.Gid); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(p, uint32(f.Mode)); err != nil {
			t.Fatal(err)
		}
	}
}

// mountOverlay mounts a fresh overlay of lower and returns the merged and
// upper directories; t.Cleanup unmounts it.
func mountOverlay(t *testing.T, lower string) (merged, upper string) {
	t.Helper()
	dir := t.TempDir()
	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,metacopy=off", lower, upper, work)
	if err := unix.Mount(mountSource, merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(merged, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", merged, err)
		}
	})
	return merged, upper
}

// capNetRaw is a security.capability value (revision 2, effective,
// permitted CAP_NET_RAW), as setcap cap_net_raw+ep writes it.
func capNetRaw() []byte {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|0x1)
	binary.LittleEndian.PutUint32(b[4:], 1<<unix.CAP_NET_RAW)
	return b
}

// buildStep is what a build step does inside the container, applied to
// the merged view of an overlay. With reversed, independent operations run
// in another order and the hard link pair is made from the other end.
func buildStep(t *testing.T, root string, reversed bool) {
	t.Helper()
	p := func(rel string) string { return filepath.Join(root, rel) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	write := func(rel, data string, mode uint32) {
		t.Helper()
		must(os.WriteFile(p(rel), []byte(data), 0o600))
		must(unix.Chmod(p(rel), mode))
	}
	ops := []func(){
		func() { // create a file with an xattr
			write("new.txt", "hello\n", 0o644)
			must(unix.Setxattr(p("new.txt"), "user.foo", []byte("bar"), 0))
		},
		func() { write("etc/config", "new\n", 0o644) },      // modify
		func() { must(os.Remove(p("gone.txt"))) },           // delete: whiteout
		func() { must(unix.Chmod(p("keep/a"), 0o600)) },     // chmod
		func() { must(os.Lchown(p("keep/b"), 1000, 1000)) }, // chown
		func() { // delete and recreate a directory: opaque
			must(os.RemoveAll(p("data")))
			must(os.Mkdir(p("data"), 0o700))
			must(unix.Chmod(p("data"), 0o755))
			write("data/fresh", "fresh\n", 0o644)
		},
		func() { // setuid and a file capability
			must(unix.Chmod(p("bin/tool"), 0o4755))
			must(unix.Setxattr(p("bin/tool"), "security.capability", capNetRaw(), 0))
		},
		func() { // a hard link pair and a symlink
			must(os.Mkdir(p("links"), 0o700))
			must(unix.Chmod(p("links"), 0o755))
			if reversed {
				write("links/two", "one\n", 0o644)
				must(os.Link(p("links/two"), p("links/one")))
			} else {
				write("links/one", "one\n", 0o644)
				must(os.Link(p("links/one"), p("links/two")))
			}
			must(os.Symlink("one", p("links/sym")))
		},
		func() { // what the sandbox makes: excluded
			must(os.Mkdir(p("run/levers9"), 0o700))
			write("run/levers9/secret", "s3cret\n", 0o600)
			write("etc/resolv.conf", "nameserver 10.0.0.1\n", 0o644)
		},
	}
	for i := range ops {
		if reversed {
			ops[len(ops)-1-i]()
		} else {
			ops[i]()
		}
	}
}

// entry is one tar entry as a test sees it.
type entry struct {
	Name     string
	Type     byte
	Mode     int64
	Uid, Gid int
	Link     string
	Data     string
	Xattrs   map[string]string
	times    [3]time.Time
	uname    string
}

func (e entry) String() string {
	return fmt.Sprintf("%s type=%q mode=%#o uid=%d gid=%d link=%q data=%q xattrs=%v", e.Name, e.Type, e.Mode, e.Uid, e.Gid, e.Link, e.Data, e.Xattrs)
}

func readTar(t *testing.T, b []byte) []entry {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out []entry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		e := entry{Name: h.Name, Type: h.Typeflag, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid, Link: h.Linkname, Data: string(data),
			times: [3]time.Time{h.ModTime, h.AccessTime, h.ChangeTime}, uname: h.Uname + h.Gname}
		for k, v := range h.PAXRecords {
			if x, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				if e.Xattrs == nil {
					e.Xattrs = map[string]string{}
				}
				e.Xattrs[x] = v
			}
		}
		out = append(out, e)
	}
}

func names(es []entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Name)
	}
	return out
}

// diffEntries reports the differences between two entry lists.
func diffEntries(got, want []entry) string {
	var b strings.Builder
	n := max(len(got), len(want))
	for i := 0; i < n; i++ {
		var g, w string
		if i < len(got) {
			g = got[i].String()
		}
		if i < len(want) {
			w = want[i].String()
		}
		if g != w {
			fmt.Fprintf(&b, "entry %d:\n  got  %s\n  want %s\n", i, g, w)
		}
	}
	return b.String()
}
