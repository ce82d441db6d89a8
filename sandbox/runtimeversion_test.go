package sandbox

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
)

func TestParseRuntimeVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		runtime string
		out     string
		want    string
		wantErr string
	}{
		{
			name: "runc debian", runtime: "runc",
			out:  "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\ngo: go1.19.8\nlibseccomp: 2.5.4\n",
			want: "1.1.5+ds1",
		},
		{
			name: "runc upstream", runtime: "runc",
			out:  "runc version 1.1.12\ncommit: v1.1.12-0-g51d5e946\nspec: 1.0.2-dev\ngo: go1.20.13\nlibseccomp: 2.5.4\n",
			want: "1.1.12",
		},
		{name: "runc rc", runtime: "runc", out: "runc version 1.2.0-rc.1\n", want: "1.2.0-rc.1"},
		{name: "runsc debian", runtime: "runsc", out: "runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n", want: "0.0~20221219.0"},
		{name: "runsc upstream", runtime: "runsc", out: "runsc version release-20231009.0\nspec: 1.1.0-rc.1\n", want: "release-20231009.0"},
		{name: "warning line first", runtime: "runsc", out: "W1202 some warning\r\nrunsc version release-20240101.0\r\n", want: "release-20240101.0"},
		{name: "other runtime's line", runtime: "runsc", out: "runc version 1.1.5\n", wantErr: `no "runsc version" line`},
		{name: "empty", runtime: "runc", out: "", wantErr: `no "runc version" line in output ""`},
		{name: "no version after prefix", runtime: "runc", out: "runc version   \n", wantErr: `"runc version" line has no version`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseRuntimeVersion(tt.runtime, tt.out)
			testenv.CheckErr(t, err, tt.wantErr)
			if got != tt.want {
				t.Errorf("parseRuntimeVersion = %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzParseRuntimeVersion(f *testing.F) {
	f.Add("runc", "runc version 1.1.5+ds1\ncommit: x\n")
	f.Add("runsc", "runsc version release-20231009.0\n")
	f.Add("runsc", "runsc version \n")
	f.Add("runc", "")
	f.Fuzz(func(t *testing.T, name, out string) {
		v, err := parseRuntimeVersion(name, out)
		if err != nil {
			if v != "" {
				t.Fatalf("error %v with version %q", err, v)
			}
			return
		}
		if v == "" || strings.ContainsAny(v, " \t\r\n") {
			t.Fatalf("version %q: want one non-empty word", v)
		}
		if !strings.Contains(out, v) {
			t.Fatalf("version %q not in output %q", v, out)
		}
	})
}

// versionRE is what the installed runtimes' versions look like.
var versionRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z.+~_-]*$`)

func TestRuntimeVersionInstalled(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"runc", "runsc"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bin := testenv.RequireBinary(t, name)[0]
			v, err := RuntimeVersion(context.Background(), bin, name, 10*time.Second)
			if err != nil {
				t.Fatalf("RuntimeVersion(%s): %v", bin, err)
			}
			if !versionRE.MatchString(v) {
				t.Fatalf("RuntimeVersion(%s) = %q, want a version", bin, v)
			}
		})
	}
}

func TestRuntimeVersionFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		bin     func(t *testing.T) string
		want    string
		wantErr string
	}{
		{
			name: "missing binary is not an error",
			bin:  func(t *testing.T) string { return "l9v-no-such-runtime" },
		},
		{
			name: "missing absolute path is not an error",
			bin:  func(t *testing.T) string { return filepath.Join(t.TempDir(), "runc") },
		},
		{
			name: "works",
			bin:  func(t *testing.T) string { return testenv.WriteScript(t, `echo "runc version 9.9.9"`) },
			want: "9.9.9",
		},
		{
			name:    "exit status",
			bin:     func(t *testing.T) string { return testenv.WriteScript(t, `echo "boom" >&2; exit 3`) },
			wantErr: `exit status 3 (output "boom\n")`,
		},
		{
			name:    "garbage output",
			bin:     func(t *testing.T) string { return testenv.WriteScript(t, `echo "hello"`) },
			wantErr: `no "runc version" line in output "hello\n"`,
		},
		{
			name:    "hangs",
			bin:     func(t *testing.T) string { return testenv.WriteScript(t, `exec sleep 60`) },
			wantErr: "no answer within 300ms",
		},
		{
			name:    "hangs with a child holding the pipe",
			bin:     func(t *testing.T) string { return testenv.WriteScript(t, `sleep 60; echo late`) },
			wantErr: "no answer within 300ms",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bin := tt.bin(t)
			start := time.Now()
			got, err := RuntimeVersion(context.Background(), bin, "runc", 300*time.Millisecond)
			testenv.CheckErr(t, err, tt.wantErr)
			if got != tt.want {
				t.Errorf("runtimeVersion = %q, want %q", got, tt.want)
			}
			// The timeout plus WaitDelay bounds every call.
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("runtimeVersion took %v", d)
			}
		})
	}
}

func TestCappedBuffer(t *testing.T) {
	t.Parallel()
	b := &cappedBuffer{max: 5}
	for _, s := range []string{"abc", "defg", "hij"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got := b.String(); got != "abcde" {
		t.Fatalf("String() = %q, want %q", got, "abcde")
	}
}
