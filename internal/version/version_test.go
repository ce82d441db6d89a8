package version

import (
	"runtime/debug"
	"testing"
)

func TestInfoString(t *testing.T) {
	t.Parallel()
	vcs := func(settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) { return &debug.BuildInfo{Settings: settings}, true }
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	tests := []struct {
		name              string
		ver, commit, time string
		read              func() (*debug.BuildInfo, bool)
		want              string
	}{
		{"unstamped without vcs", "dev", "unknown", "", none, "dev (commit unknown)"},
		{"stamped release", "v0.3.0", "0db67d4c1a2b3c4d5e6f", "2026-12-03T20:59:00Z", none, "v0.3.0 (commit 0db67d4c1a2b, 2026-12-03)"},
		{"stamped wins over vcs", "v1", "abc", "", vcs(debug.BuildSetting{Key: "vcs.revision", Value: "fff"}), "v1 (commit abc)"},
		{"dev build falls back to vcs", "dev", "unknown", "", vcs(
			debug.BuildSetting{Key: "vcs.revision", Value: "1234567890abcdef"},
			debug.BuildSetting{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "dev (commit 1234567890ab-modified, 2026-01-02)"},
		{"empty commit", "dev", "", "", none, "dev (commit unknown)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := info(tc.ver, tc.commit, tc.time, tc.read).String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
