// Package testenv owns the rules for tests that touch the host: on a
// developer's laptop a missing prerequisite (root, a binary) skips the test,
// but under CI (CI=true) it fails it, so privileged tests can never silently
// stop running. It is imported only from _test files and never touches host
// state itself.
package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// InCI reports whether the tests run under CI, where prerequisites are
// mandatory.
func InCI() bool {
	v, _ := strconv.ParseBool(os.Getenv("CI"))
	return v
}

// Missing skips the test, or fails it under CI, naming the prerequisite.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("prerequisite missing under CI=true: "+format, args...)
	}
	t.Skipf("prerequisite missing: "+format, args...)
}

// RequireRoot skips (or fails under CI) unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root")
	}
}

// RequireBinary returns the path of each named binary, skipping (or failing
// under CI) when one is not on PATH.
func RequireBinary(t testing.TB, names ...string) []string {
	t.Helper()
	paths := make([]string, 0, len(names))
	for _, n := range names {
		p, err := exec.LookPath(n)
		if err != nil {
			Missing(t, "binary %q not on PATH", n)
		}
		paths = append(paths, p)
	}
	return paths
}

// FindBinary looks for a binary on PATH and then in extra directories (the
// Debian packages put postgres under /usr/lib/postgresql/N/bin).
func FindBinary(name string, extra ...string) (string, bool) {
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	for _, dir := range extra {
		p := dir + "/" + name
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}
