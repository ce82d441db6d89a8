package volumes

import (
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
)

func TestValidateName(t *testing.T) {
	for _, tt := range []struct {
		name string
		ok   bool
	}{
		{"data", true}, {"a", true}, {"ckpt-2026", true}, {"0abc", true},
		{"", false}, {"-data", false}, {"data-", false}, {"Data", false}, {"da_ta", false},
		{"a/b", false}, {"..", false}, {string(make([]byte, 64)), false},
		{"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabc", true},
		{"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcd", false},
	} {
		err := ValidateName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidateName(%q): %v is not invalid-argument", tt.name, err)
		}
	}
}

func TestValidateTarget(t *testing.T) {
	for _, tt := range []struct {
		path   string
		valid  bool
		unsafe bool
	}{
		{"/data", true, false}, {"/mnt/ckpt", true, false}, {"/workspace/x", true, false},
		{"/devices", true, false}, {"/process", true, false}, {"/run", true, true},
		{"/", true, true}, {"/proc", true, true}, {"/proc/1", true, true}, {"/sys", true, true},
		{"/sys/fs/cgroup", true, true}, {"/dev", true, true}, {"/dev/shm", true, true},
		{"/etc", true, true}, {"/etc/passwd", true, true}, {"/usr/bin", true, true},
		{"data", false, false}, {"/data/", false, false}, {"/data/../proc", false, false},
	} {
		err := ValidateTarget(tt.path)
		if (err == nil) != tt.valid {
			t.Errorf("ValidateTarget(%q) = %v, want valid=%v", tt.path, err, tt.valid)
		}
		if err != nil && !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidateTarget(%q) = %v, not invalid-argument", tt.path, err)
		}
		if !tt.valid {
			continue
		}
		if why := UnsafeTarget(tt.path); (why != "") != tt.unsafe {
			t.Errorf("UnsafeTarget(%q) = %q, want unsafe=%v", tt.path, why, tt.unsafe)
		}
	}
}

func TestParseRef(t *testing.T) {
	r, err := ParseRef("data:/data:ro")
	if err != nil || r != (Ref{Name: "data", Path: "/data", ReadOnly: true}) || r.String() != "data:/data:ro" {
		t.Fatalf("ParseRef = %+v, %v", r, err)
	}
	if r, err := ParseRef("ck:/mnt/ck"); err != nil || r.ReadOnly {
		t.Fatalf("ParseRef rw = %+v, %v", r, err)
	}
	// The pool's volume mount validation judges where (data:/proc), at
	// submit; parsing judges only the form.
	if _, err := ParseRef("data:/proc"); err != nil {
		t.Errorf("ParseRef(data:/proc): %v", err)
	}
	for _, bad := range []string{"data", "data:/x/../y", "Data:/x", "data:/x:rx", "data:/x:ro:z", "data:rel"} {
		if _, err := ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q) accepted", bad)
		}
	}
}

func TestSizes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1024": 1024, "10G": 10 << 30, "10GiB": 10 << 30, "512Mi": 512 << 20, "3k": 3 << 10, "1T": 1 << 40} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "G", "-1", "1X", "1.5G", "99999999999T"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
	for in, want := range map[int64]string{0: "0 B", 512: "512 B", 1536: "1.5 KiB", 10 << 30: "10.0 GiB"} {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestUnescape(t *testing.T) {
	if got := unescape(`/mnt/a\040b\134c`); got != `/mnt/a b\c` {
		t.Fatalf("unescape = %q", got)
	}
}

func TestCleanFilePath(t *testing.T) {
	for _, tt := range []struct {
		in, want string
		ok       bool
	}{
		{"", "/", true},
		{"/", "/", true},
		{".", "/", true},
		{"./", "/", true},
		{"a", "/a", true},
		{"/a/b/", "/a/b", true},
		{"a//b", "/a/b", true},
		{"a/./b", "/a/b", true},
		{"a/../b", "/b", true},
		{"a/..", "/", true},
		{"//a", "/a", true},
		{"..", "", false},
		{"/..", "", false},
		{"../a", "", false},
		{"a/../../b", "", false},
		{"/a/../..", "", false},
		{"a\x00b", "", false},
		{"..a", "/..a", true},
		{"a/..b", "/a/..b", true},
	} {
		got, err := CleanFilePath(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("CleanFilePath(%q) = %q, %v; want ok=%v", tt.in, got, err, tt.ok)
			continue
		}
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("CleanFilePath(%q): %v is not invalid-argument", tt.in, err)
			}
			continue
		}
		if got != tt.want {
			t.Errorf("CleanFilePath(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
