package image_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/sandbox/image/build"
)

// netRawCap is a VFS_CAP_REVISION_2 xattr: permitted+effective CAP_NET_RAW.
const netRawCap = "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"

// entry is one raw tar entry; tests write exactly what a hostile registry
// could serve.
type entry struct {
	name, link string
	typ        byte
	mode       int64
	data       string
	uid        int
	pax        map[string]string
}

func rawTar(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: mode, Uid: e.uid, Gid: e.uid, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX, PAXRecords: e.pax}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(e.data))
		}
		if typ == tar.TypeChar || typ == tar.TypeBlock {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %q: %v", e.name, err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func pushLayers(t *testing.T, host, repo string, layers ...[]entry) build.Result {
	t.Helper()
	var tars [][]byte
	for _, l := range layers {
		tars = append(tars, rawTar(t, l))
	}
	res, err := build.Push(testCtx(t), host, repo, "v1", tars, build.Options{Config: build.Config{Cmd: []string{"/bin/sh"}}})
	if err != nil {
		t.Fatalf("push %s: %v", repo, err)
	}
	return res
}

func TestPullRefusesMaliciousLayers(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	benign := []entry{{name: "sub/", typ: tar.TypeDir, mode: 0o755}, {name: "sub/f", data: "f"}}
	tests := []struct {
		name   string
		layers [][]entry
		// entry is the refused entry's name; want a phrase of the reason.
		entry, want string
	}{
		{"traversal", [][]entry{{{name: "../../../../../../tmp/l9i-escape", data: "x"}}}, "../../../../../../tmp/l9i-escape", "path traversal"},
		{"traversal inside a path", [][]entry{{{name: "usr/../../tmp/l9i-escape", data: "x"}}}, "usr/../../tmp/l9i-escape", "path traversal"},
		{"absolute path", [][]entry{{{name: "/tmp/l9i-abs-escape", data: "x"}}}, "/tmp/l9i-abs-escape", "absolute path"},
		{"char device", [][]entry{{{name: "dev/l9i-null", typ: tar.TypeChar}}}, "dev/l9i-null", "device node"},
		{"block device", [][]entry{{{name: "dev/l9i-sda", typ: tar.TypeBlock}}}, "dev/l9i-sda", "device node"},
		{"absolute symlink", [][]entry{{{name: "etc/l9i-shadow", typ: tar.TypeSymlink, link: "/etc/shadow"}}}, "etc/l9i-shadow", "absolute symlink"},
		{"relative symlink escaping", [][]entry{{{name: "a/b/l9i-up", typ: tar.TypeSymlink, link: "../../../etc"}}}, "a/b/l9i-up", "escapes the root"},
		{"hardlink escaping", [][]entry{{{name: "l9i-passwd", typ: tar.TypeLink, link: "../../../../etc/passwd"}}}, "l9i-passwd", "path traversal"},
		{"hardlink absolute", [][]entry{{{name: "l9i-passwd", typ: tar.TypeLink, link: "/etc/passwd"}}}, "l9i-passwd", "absolute path"},
		{"hardlink to a missing file", [][]entry{{{name: "l9i-h", typ: tar.TypeLink, link: "nope"}}}, "l9i-h", "does not exist"},
		{"symlink then write through it", [][]entry{append(benign, entry{name: "d", typ: tar.TypeSymlink, link: "sub"}, entry{name: "d/l9i-x", data: "x"})}, "d/l9i-x", "refusing to write through"},
		{"symlink in one layer, write through it in the next", [][]entry{{{name: "d", typ: tar.TypeSymlink, link: "."}}, {{name: "d/l9i-x", data: "x"}}}, "d/l9i-x", "refusing to write through"},
		{"whiteout through a symlink", [][]entry{append(benign, entry{name: "l", typ: tar.TypeSymlink, link: "sub"}), {{name: "l/.wh.f"}}}, "l/.wh.f", "refusing to write through"},
		{"hardlink through a symlink", [][]entry{append(benign, entry{name: "l", typ: tar.TypeSymlink, link: "sub"}, entry{name: "h", typ: tar.TypeLink, link: "l/f"})}, "h", "refusing to write through"},
		{"malformed whiteout", [][]entry{{{name: "a/.wh..", data: ""}}}, "a/.wh..", "malformed whiteout"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pushed := pushLayers(t, b.reg.Host, fmt.Sprintf("l9i/evil%d", i), tt.layers...)
			layers := manifestLayers(t, b.reg.Host, pushed.DigestRef)
			bad := layers[len(layers)-1]
			_, err := b.store.Pull(ctx, pushed.Ref)
			if !errors.Is(err, image.ErrUnsafeLayer) || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("Pull = %v, want ErrUnsafeLayer and invalid argument", err)
			}
			t.Logf("refused: %v", err)
			for _, want := range []string{bad, fmt.Sprintf("%q", tt.entry), tt.want} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			if _, err := b.store.Get(ctx, pushed.Digest); !errdefs.IsNotFound(err) {
				t.Errorf("refused image is in the cache: %v", err)
			}
		})
	}
	for _, p := range []string{"/tmp/l9i-escape", "/tmp/l9i-abs-escape"} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after refused pulls: %v", p, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(b.root, "rootfs")); len(ents) != 0 {
		t.Errorf("rootfs has refused images: %v", ents)
	}
	if ents, _ := os.ReadDir(filepath.Join(b.root, "tmp")); len(ents) != 0 {
		t.Errorf("tmp not cleaned: %v", ents)
	}
}

func TestPullAppliesWhiteoutsAndLinks(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	pushed := pushLayers(t, b.reg.Host, "l9i/layers",
		[]entry{
			{name: "a/", typ: tar.TypeDir, mode: 0o755},
			{name: "a/x", data: "x"},
			{name: "a/y", data: "y"},
			{name: "a/sub/deep", data: "deep"},
			{name: "b/z", data: "z"},
			{name: "c/keep", data: "old", mode: 0o600},
			{name: "c/hl", typ: tar.TypeLink, link: "c/keep"},
			{name: "c/rel", typ: tar.TypeSymlink, link: "../a"},
			{name: "c/fifo", typ: tar.TypeFifo, mode: 0o640},
			{name: "c/dir-to-file/", typ: tar.TypeDir, mode: 0o755},
			{name: "c/dir-to-file/inner", data: "i"},
		},
		[]entry{
			{name: "a/new", data: "new"},
			{name: "a/.wh..wh..opq"},
			{name: "b/.wh.z"},
			{name: "c/keep", data: "new", mode: 0o644},
			{name: "c/dir-to-file", data: "now a file"},
			{name: "c/.wh..wh.plnk"},
			{name: "home/user/", typ: tar.TypeDir, mode: 0o700, uid: 1000},
			{name: "home/user/file", data: "u", uid: 1000},
			{name: "home/user/link", typ: tar.TypeSymlink, link: "file", uid: 1000},
			{name: "bin/ping", data: "ping", mode: 0o755, pax: map[string]string{"SCHILY.xattr.security.capability": netRawCap}},
			{name: "ovl/", typ: tar.TypeDir, mode: 0o755, pax: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}},
		},
	)
	img, err := b.store.Pull(ctx, pushed.Ref)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	read := func(p string) string {
		data, err := os.ReadFile(filepath.Join(img.RootFS, p))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(data)
	}
	names := func(p string) []string {
		ents, err := os.ReadDir(filepath.Join(img.RootFS, p))
		if err != nil {
			t.Fatalf("read dir %s: %v", p, err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	if got := names("a"); len(got) != 1 || got[0] != "new" {
		t.Errorf("a/ = %v after opaque whiteout, want [new]", got)
	}
	if got := names("b"); len(got) != 0 {
		t.Errorf("b/ = %v after whiteout of z, want empty", got)
	}
	if got := read("c/keep"); got != "new" {
		t.Errorf("c/keep = %q, want new", got)
	}
	if got := read("c/hl"); got != "old" {
		t.Errorf("c/hl = %q, want old (the hardlink keeps the replaced file)", got)
	}
	if got := read("c/dir-to-file"); got != "now a file" {
		t.Errorf("c/dir-to-file = %q", got)
	}
	if l, err := os.Readlink(filepath.Join(img.RootFS, "c/rel")); err != nil || l != "../a" {
		t.Errorf("c/rel -> %q, %v", l, err)
	}
	if st, err := os.Lstat(filepath.Join(img.RootFS, "c/fifo")); err != nil || st.Mode()&os.ModeNamedPipe == 0 || st.Mode().Perm() != 0o640 {
		t.Errorf("c/fifo = %v, %v; want a 0640 fifo", st, err)
	}
	if os.Geteuid() == 0 {
		for _, p := range []string{"home/user", "home/user/file", "home/user/link"} {
			st, err := os.Lstat(filepath.Join(img.RootFS, p))
			if err != nil {
				t.Fatal(err)
			}
			if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 1000 || sys.Gid != 1000 {
				t.Errorf("%s owned by %d:%d, want 1000:1000", p, sys.Uid, sys.Gid)
			}
		}
		buf := make([]byte, 64)
		if n, err := unix.Getxattr(filepath.Join(img.RootFS, "bin/ping"), "security.capability", buf); err != nil || string(buf[:n]) != netRawCap {
			t.Errorf("bin/ping capability = %x, %v; want %x", buf[:max(n, 0)], err, netRawCap)
		}
		if _, err := unix.Getxattr(filepath.Join(img.RootFS, "ovl"), "trusted.overlay.opaque", buf); err == nil {
			t.Errorf("trusted.overlay.opaque from a layer was applied")
		}
		if st, _ := os.Stat(filepath.Join(img.RootFS, "home/user")); st.Mode().Perm() != 0o700 {
			t.Errorf("home/user mode = %v, want 0700", st.Mode())
		}
	}
	for _, wh := range []string{"a/.wh..wh..opq", "b/.wh.z", "c/.wh..wh.plnk"} {
		if _, err := os.Lstat(filepath.Join(img.RootFS, wh)); !os.IsNotExist(err) {
			t.Errorf("whiteout %s materialised: %v", wh, err)
		}
	}
}

func TestReadFileResolvesInsideTheRoot(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	s, _ := b.newStore(t, func(c *image.Config) { c.AllowAbsoluteSymlinks = true })
	pushed := pushLayers(t, b.reg.Host, "l9i/readfile", []entry{
		{name: "etc/passwd", data: "image-passwd\n"},
		{name: "etc/abs", typ: tar.TypeSymlink, link: "/etc/passwd"},
		{name: "etc/fifo", typ: tar.TypeFifo},
	})
	if _, err := b.store.Pull(ctx, pushed.Ref); !errors.Is(err, image.ErrUnsafeLayer) {
		t.Fatalf("default store Pull = %v, want the absolute symlink refused", err)
	}
	img, err := s.Pull(ctx, pushed.Ref)
	if err != nil {
		t.Fatalf("Pull with AllowAbsoluteSymlinks: %v", err)
	}
	tests := []struct {
		name    string
		limit   int64
		want    string
		wantErr func(error) bool
	}{
		{name: "/etc/passwd", limit: 100, want: "image-passwd\n"},
		{name: "/etc/abs", limit: 100, want: "image-passwd\n"},
		{name: "etc/../../../../etc/passwd", limit: 100, want: "image-passwd\n"},
		{name: "/etc/fifo", limit: 100, wantErr: errdefs.IsInvalidArgument},
		{name: "/etc/passwd", limit: 3, wantErr: errdefs.IsInvalidArgument},
		{name: "/etc/shadow", limit: 100, wantErr: errdefs.IsNotFound},
	}
	for _, tt := range tests {
		got, err := image.ReadFile(img.RootFS, tt.name, tt.limit)
		if tt.wantErr != nil {
			if !tt.wantErr(err) {
				t.Errorf("ReadFile(%s, %d) = %q, %v; want the error kind", tt.name, tt.limit, got, err)
			}
			continue
		}
		if err != nil || string(got) != tt.want {
			t.Errorf("ReadFile(%s) = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

func TestPullRefusesImagesAboveTheUnpackedLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	s, _ := b.newStore(t, func(c *image.Config) { c.MaxUnpackedSize = 1000 })
	big := strings.Repeat("z", 600)
	pushed := pushLayers(t, b.reg.Host, "l9i/bomb", []entry{{name: "a", data: big}}, []entry{{name: "b", data: big}})
	_, err := s.Pull(ctx, pushed.Ref)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `entry "b"`) || !strings.Contains(err.Error(), "size limit") {
		t.Fatalf("Pull = %v, want entry \"b\" refused for the size limit", err)
	}
}
