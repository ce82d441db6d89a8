package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReadExit: the holder writes its status in place, so a file without
// its newline is one still being written, not a status.
func TestReadExit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content *string
		code    int
		ok      bool
	}{
		{"missing", nil, 0, false},
		{"empty", ptr(""), 0, false},
		{"no newline yet", ptr("13"), 0, false},
		{"zero", ptr("0\n"), 0, true},
		{"code", ptr("3\n"), 3, true},
		{"signal", ptr("137\n"), 137, true},
		{"garbage", ptr("x\n"), -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), exitFile)
			if tc.content != nil {
				if err := os.WriteFile(p, []byte(*tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			code, ok := readExit(p)
			if code != tc.code || ok != tc.ok {
				t.Errorf("readExit = %d, %v; want %d, %v", code, ok, tc.code, tc.ok)
			}
		})
	}
}

func ptr(s string) *string { return &s }
