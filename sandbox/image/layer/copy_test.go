package layer_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image/layer"
)

// srcTar writes a source tar as a client would; owner and times vary with
// salt so tests can show they do not reach the layer.
func srcTar(t *testing.T, hdrs []tar.Header, salt int) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		h.Uid, h.Gid, h.Uname = 1000+salt, 1000+salt, "dev"
		h.ModTime = time.Date(2025, 1, 1, 0, 0, salt, 0, time.UTC)
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Linkname))
			data := h.Linkname
			h.Linkname = ""
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write([]byte(data)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// file, dir, sym and hard describe source entries (a file's data rides in
// Linkname until srcTar writes it).
func file(n, data string, mode int64) tar.Header {
	return tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: mode, Linkname: data}
}
func dir(n string, mode int64) tar.Header {
	return tar.Header{Name: n, Typeflag: tar.TypeDir, Mode: mode}
}
func sym(n, target string) tar.Header {
	return tar.Header{Name: n, Typeflag: tar.TypeSymlink, Mode: 0o777, Linkname: target}
}
func hard(n, target string) tar.Header {
	return tar.Header{Name: n, Typeflag: tar.TypeLink, Mode: 0o644, Linkname: target}
}

func fromCopy(t *testing.T, src []byte, dst string) ([]byte, error) {
	t.Helper()
	var buf bytes.Buffer
	err := layer.FromCopy(context.Background(), bytes.NewReader(src), dst, &buf, layer.Options{Exclude: excludes})
	return buf.Bytes(), err
}

func TestFromCopyPlaces(t *testing.T) {
	hdrs := []tar.Header{
		dir("./", 0o750),
		file("./main.py", "print(1)\n", 0o644),
		dir("./bin/", 0o755),
		file("./bin/run", "#!/bin/sh\n", 0o4755),
		file("lib/deep/x.py", "x\n", 0o600), // parents left out by the client
		sym("./link", "main.py"),
		sym("./abs", "/etc/passwd"),
		hard("./again.py", "./main.py"),
	}
	a, err := fromCopy(t, srcTar(t, hdrs, 1), "/srv/app")
	if err != nil {
		t.Fatal(err)
	}
	want := []entry{
		{Name: "srv/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "srv/app/", Type: tar.TypeDir, Mode: 0o750},
		{Name: "srv/app/main.py", Type: tar.TypeReg, Mode: 0o644, Data: "print(1)\n"},
		{Name: "srv/app/bin/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "srv/app/bin/run", Type: tar.TypeReg, Mode: 0o4755, Data: "#!/bin/sh\n"},
		{Name: "srv/app/lib/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "srv/app/lib/deep/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "srv/app/lib/deep/x.py", Type: tar.TypeReg, Mode: 0o600, Data: "x\n"},
		{Name: "srv/app/link", Type: tar.TypeSymlink, Mode: 0o777, Link: "main.py"},
		{Name: "srv/app/abs", Type: tar.TypeSymlink, Mode: 0o777, Link: "/etc/passwd"},
		{Name: "srv/app/again.py", Type: tar.TypeLink, Mode: 0o644, Link: "srv/app/main.py"},
	}
	got := readTar(t, a)
	if d := diffEntries(got, want); d != "" {
		t.Fatalf("FromCopy entries differ:\n%s", d)
	}
	for _, e := range got {
		if !e.times[0].Equal(time.Unix(0, 0)) || e.uname != "" {
			t.Fatalf("%s: mtime %v uname %q", e.Name, e.times[0], e.uname)
		}
	}
	// Other owners and times in the source: the same bytes.
	b, err := fromCopy(t, srcTar(t, hdrs, 7), "/srv/app/")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("FromCopy is not deterministic across source owners and times")
	}

	// Without a "." entry dst is made 0755 before its first child; to / no
	// parents at all; an empty source still makes dst.
	got = readTar(t, must(fromCopy(t, srcTar(t, []tar.Header{file("a", "a", 0o644)}, 0), "/opt/x")))
	if n := names(got); strings.Join(n, " ") != "opt/ opt/x/ opt/x/a" {
		t.Fatalf("names %q", n)
	}
	got = readTar(t, must(fromCopy(t, srcTar(t, []tar.Header{dir(".", 0o700), file("a", "a", 0o644)}, 0), "/")))
	if n := names(got); strings.Join(n, " ") != "a" {
		t.Fatalf("copy to / names %q", n)
	}
	got = readTar(t, must(fromCopy(t, srcTar(t, nil, 0), "/empty")))
	if n := names(got); strings.Join(n, " ") != "empty/" {
		t.Fatalf("empty copy names %q", n)
	}
	// Excluded destinations are left out.
	got = readTar(t, must(fromCopy(t, srcTar(t, []tar.Header{file("hosts", "x", 0o644), file("ok", "y", 0o644)}, 0), "/etc")))
	if n := names(got); strings.Join(n, " ") != "etc/ etc/ok" {
		t.Fatalf("excluded copy names %q", n)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestFromCopyRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdrs []tar.Header
		dst  string
		want string
		kind error
	}{
		{"dotdot", []tar.Header{file("../x", "x", 0o644)}, "/app", `entry "../x"`, layer.ErrUnsafeEntry},
		{"inner dotdot", []tar.Header{file("a/../../x", "x", 0o644)}, "/app", `".." in name`, layer.ErrUnsafeEntry},
		{"absolute", []tar.Header{file("/etc/passwd", "x", 0o644)}, "/app", `entry "/etc/passwd"`, layer.ErrUnsafeEntry},
		{"whiteout", []tar.Header{file(".wh.bin", "", 0o644)}, "/", `reserved for whiteouts`, layer.ErrUnsafeEntry},
		{"hard link outside", []tar.Header{hard("h", "/etc/shadow")}, "/app", `hard link target "/etc/shadow"`, layer.ErrUnsafeEntry},
		{"hard link missing", []tar.Header{hard("h", "nothere")}, "/app", `not a file earlier in the tar`, layer.ErrUnsafeEntry},
		{"hard link before target", []tar.Header{hard("h", "f"), file("f", "x", 0o644)}, "/app", `not a file earlier`, layer.ErrUnsafeEntry},
		{"hard link to dir", []tar.Header{dir("d/", 0o755), hard("h", "d")}, "/app", `not a file earlier`, layer.ErrUnsafeEntry},
		{"hard link escaping", []tar.Header{file("f", "x", 0o644), hard("h", "../f")}, "/app", `".." in name`, layer.ErrUnsafeEntry},
		{"device", []tar.Header{{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}}, "/app", `type "3" cannot be copied`, layer.ErrUnsafeEntry},
		{"duplicate", []tar.Header{file("f", "x", 0o644), file("f", "y", 0o644)}, "/app", `appears twice`, layer.ErrUnsafeEntry},
		{"relative dst", []tar.Header{file("f", "x", 0o644)}, "app", `not an absolute path`, errdefs.ErrInvalidArgument},
		{"dst dotdot", []tar.Header{file("f", "x", 0o644)}, "/app/../etc", `holds ".."`, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fromCopy(t, srcTar(t, tc.hdrs, 0), tc.dst)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.kind) {
				t.Fatalf("FromCopy error = %v, want %v containing %s", err, tc.kind, tc.want)
			}
		})
	}
}

// TestFromCopyImageDirs: the directories a copy creates take the image's
// mode and owner (Lookup), and a symlink or file on the way is refused.
func TestFromCopyImageDirs(t *testing.T) {
	image := map[string]*tar.Header{
		"/tmp":      {Typeflag: tar.TypeDir, Mode: 0o1777},
		"/home":     {Typeflag: tar.TypeDir, Mode: 0o755},
		"/home/app": {Typeflag: tar.TypeDir, Mode: 0o700, Uid: 1000, Gid: 1001},
		"/bin":      {Typeflag: tar.TypeSymlink, Linkname: "usr/bin"},
		"/etc":      {Typeflag: tar.TypeDir, Mode: 0o755},
		"/etc/motd": {Typeflag: tar.TypeReg, Mode: 0o644},
	}
	lookup := func(p string) (*tar.Header, error) { return image[p], nil }
	copyTo := func(dst string, src []tar.Header) ([]byte, error) {
		var buf bytes.Buffer
		err := layer.FromCopy(context.Background(), bytes.NewReader(srcTar(t, src, 0)), dst, &buf, layer.Options{Lookup: lookup})
		return buf.Bytes(), err
	}
	got := readTar(t, must(copyTo("/tmp/work/x", []tar.Header{file("a", "a", 0o644)})))
	want := []entry{
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
		{Name: "tmp/work/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "tmp/work/x/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "tmp/work/x/a", Type: tar.TypeReg, Mode: 0o644, Data: "a"},
	}
	if d := diffEntries(got, want); d != "" {
		t.Fatalf("copy under /tmp:\n%s", d)
	}
	got = readTar(t, must(copyTo("/home/app", []tar.Header{file("src.py", "x", 0o644)})))
	if len(got) != 3 || got[1].Name != "home/app/" || got[1].Mode != 0o700 || got[1].Uid != 1000 || got[1].Gid != 1001 {
		t.Fatalf("copy into /home/app: %+v", got)
	}
	for dst, wantErr := range map[string]string{
		"/bin/tool":      "/bin is a symlink to usr/bin in the image",
		"/etc/motd/x":    "/etc/motd is a file in the image",
		"/bin/deep/tool": "/bin is a symlink",
	} {
		if _, err := copyTo(dst, []tar.Header{file("a", "a", 0o644)}); err == nil || !strings.Contains(err.Error(), wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("copy to %s: %v; want %q", dst, err, wantErr)
		}
	}
}
