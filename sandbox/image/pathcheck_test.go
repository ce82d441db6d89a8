package image

import (
	"errors"
	"path"
	"strings"
	"testing"
)

func TestCleanEntryName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    string
		wantErr string
	}{
		{in: "bin/sh", want: "bin/sh"},
		{in: "./bin/sh", want: "bin/sh"},
		{in: "bin//sh/", want: "bin/sh"},
		{in: "./", want: "."},
		{in: ".", want: "."},
		{in: "", wantErr: "empty"},
		{in: "/etc/passwd", wantErr: "absolute"},
		{in: "../etc/passwd", wantErr: "traversal"},
		{in: "a/../../b", wantErr: "traversal"},
		{in: "a/..", wantErr: "traversal"},
		{in: "a\x00b", wantErr: "NUL"},
		{in: strings.Repeat("a", 256), wantErr: "component longer"},
		{in: strings.Repeat("a/", 2049), wantErr: "longer than 4096"},
	}
	for _, tt := range tests {
		got, err := cleanEntryName(tt.in)
		if tt.wantErr != "" {
			if err == nil || !errors.Is(err, errUnsafeEntry) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("cleanEntryName(%q) = %q, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("cleanEntryName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestCheckSymlinkTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		rel, target string
		allowAbs    bool
		ok          bool
	}{
		{"bin/sh", "busybox", false, true},
		{"usr/bin/sh", "../../bin/busybox", false, true},
		{"usr/bin/sh", "../../../bin/busybox", false, false},
		{"sh", "..", false, false},
		{"a/b", "../x/../..", false, false},
		{"a/b", "./../.", false, true},
		{"etc/localtime", "/usr/share/zoneinfo/UTC", false, false},
		{"etc/localtime", "/usr/share/zoneinfo/UTC", true, true},
		{"x", "", false, false},
	}
	for _, tt := range tests {
		err := checkSymlinkTarget(tt.rel, tt.target, tt.allowAbs)
		if (err == nil) != tt.ok {
			t.Errorf("checkSymlinkTarget(%q, %q, %v) = %v, want ok=%v", tt.rel, tt.target, tt.allowAbs, err, tt.ok)
		}
	}
}

func TestWhiteoutTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		base           string
		hidden         string
		opaque, ok, er bool
	}{
		{base: "file"},
		{base: ".wh.file", hidden: "file", ok: true},
		{base: ".wh..wh..opq", opaque: true, ok: true},
		{base: ".wh..wh.plnk", ok: true},
		{base: ".wh.", ok: true, er: true},
		{base: ".wh...", ok: true, er: true},
	}
	for _, tt := range tests {
		hidden, opaque, ok, err := whiteoutTarget(tt.base)
		if hidden != tt.hidden || opaque != tt.opaque || ok != tt.ok || (err != nil) != tt.er {
			t.Errorf("whiteoutTarget(%q) = %q, %v, %v, %v", tt.base, hidden, opaque, ok, err)
		}
	}
}

// FuzzEntryPath checks the invariants the unpacker relies on: an accepted
// entry name is clean and relative with no "..", and an accepted symlink
// target, resolved lexically from the link's directory, stays in the root.
func FuzzEntryPath(f *testing.F) {
	for _, s := range []struct{ name, target string }{
		{"bin/sh", "busybox"}, {"../x", "y"}, {"/abs", "/abs"}, {"a/b/c", "../../.."},
		{"a/b", "../../etc"}, {"./a//b/", "./."}, {".wh..wh..opq", ""}, {"a/.wh.b", "c/../d"},
		{"a\x00", "\x00"}, {"..", ".."},
	} {
		f.Add(s.name, s.target)
	}
	f.Fuzz(func(t *testing.T, name, target string) {
		rel, err := cleanEntryName(name)
		if err != nil {
			if !errors.Is(err, errUnsafeEntry) {
				t.Fatalf("cleanEntryName(%q) error %v is not errUnsafeEntry", name, err)
			}
			return
		}
		if rel != "." {
			if strings.HasPrefix(rel, "/") || path.Clean(rel) != rel || strings.Contains(rel, "\x00") {
				t.Fatalf("cleanEntryName(%q) = %q: not clean and relative", name, rel)
			}
			for _, c := range strings.Split(rel, "/") {
				if c == ".." || c == "." || c == "" {
					t.Fatalf("cleanEntryName(%q) = %q: component %q", name, rel, c)
				}
			}
		}
		if err := checkSymlinkTarget(rel, target, false); err == nil {
			if strings.HasPrefix(target, "/") {
				t.Fatalf("absolute target %q accepted", target)
			}
			resolved := path.Join("/root", path.Dir(rel), target)
			if resolved != "/root" && !strings.HasPrefix(resolved, "/root/") {
				t.Fatalf("symlink %q -> %q resolves to %q, outside the root", rel, target, resolved)
			}
		}
		if _, _, _, err := whiteoutTarget(path.Base(rel)); err != nil && !errors.Is(err, errUnsafeEntry) {
			t.Fatalf("whiteoutTarget error %v is not errUnsafeEntry", err)
		}
	})
}
