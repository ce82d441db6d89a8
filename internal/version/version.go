// Package version owns the version and commit levers9's binaries report:
// `levers9 version`, `levers9-agent --version`, `levers9-controlplane
// --version`, the agent's enroll and heartbeat (shown in `machine list`) and
// the controlplane's gRPC header. Release builds (packaging/release) set the
// variables below with -ldflags -X; nothing else may write them. A plain
// `go build` leaves them at "dev"/"unknown", and String then falls back to
// the commit the Go toolchain embeds (vcs.revision) when it has one. There
// is no build time: a release stamps the commit's own time, so two builds of
// one commit are byte for byte the same. The API (three variables, String,
// Info) is stable.
package version

import (
	"runtime/debug"
	"strings"
)

// Set at link time by packaging/release/release.sh, e.g.
//
//	-X github.com/levers9/levers9/internal/version.Version=v0.3.0
//
// They are variables only because -X needs them to be; read them through
// Info or String.
var (
	// Version is `git describe --tags --always --dirty` of the build, or
	// the VERSION the release was given.
	Version = "dev"
	// Commit is the full git commit hash the binary was built from.
	Commit = "unknown"
	// CommitTime is the commit's time (RFC 3339, UTC), not the build's,
	// so rebuilding a commit reproduces the binary.
	CommitTime = ""
)

// BuildInfo is what a binary knows of its build.
type BuildInfo struct {
	Version    string `json:"version"`
	Commit     string `json:"commit"`
	CommitTime string `json:"commitTime,omitempty"`
	// Modified is set for a dev build whose tree had uncommitted changes
	// (release builds say so in Version with -dirty instead).
	Modified bool `json:"modified,omitempty"`
}

// Info returns the stamped values, or for an unstamped dev build the commit
// the Go toolchain recorded, if any.
func Info() BuildInfo {
	return info(Version, Commit, CommitTime, debug.ReadBuildInfo)
}

// info is Info with its inputs passed in, for tests.
func info(ver, commit, commitTime string, read func() (*debug.BuildInfo, bool)) BuildInfo {
	b := BuildInfo{Version: ver, Commit: commit, CommitTime: commitTime}
	if b.Commit != "unknown" && b.Commit != "" {
		return b
	}
	bi, ok := read()
	if !ok {
		return b
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			if b.CommitTime == "" {
				b.CommitTime = s.Value
			}
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is the one line every binary prints for its version, short enough
// for the agent's enroll limit (64 bytes) with an ordinary tag:
//
//	v0.3.0 (commit 0db67d4c1a2b, 2026-12-03)
//	dev (commit unknown)
func String() string { return Info().String() }

// String formats b as the package's String does.
func (b BuildInfo) String() string {
	var sb strings.Builder
	sb.WriteString(b.Version)
	sb.WriteString(" (commit ")
	sb.WriteString(short(b.Commit))
	if b.Modified {
		sb.WriteString("-modified")
	}
	if len(b.CommitTime) >= len("2006-01-02") {
		sb.WriteString(", ")
		sb.WriteString(b.CommitTime[:len("2006-01-02")])
	}
	sb.WriteString(")")
	return sb.String()
}

// short cuts a commit hash to 12 hex digits, enough to be unique in any
// repository of this size and what `git log --abbrev=12` prints.
func short(commit string) string {
	if commit == "" {
		return "unknown"
	}
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

// Header is the gRPC response header that carries the controlplane's
// String on every unary answer, the health check's included, so a client
// learns the server's version without a token or an API of its own.
const Header = "levers9-version"
