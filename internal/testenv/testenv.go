// Package testenv owns the rules for tests that touch the host: on a
// developer's laptop a missing prerequisite (root, a binary) skips the test,
// but under CI (CI=true) it fails it, so privileged tests can never silently
// stop running. It also owns the one polling helper tests use to wait for
// a condition with a deadline (Eventually) instead of a bare sleep. It is
// imported only from _test files and test-support packages, never touches
// host state itself, and never sleeps without a deadline. Internal: its API
// changes with the tests that use it.
package testenv

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// LogWriter returns a writer for a test's logger that passes each write to
// t.Log when the environment variable env is set (AGENT_TEST_LOGS=1 go test
// ...) and drops it otherwise, so quiet runs stay quiet.
func LogWriter(t testing.TB, env string) io.Writer {
	return logWriter{t: t, on: os.Getenv(env) != ""}
}

type logWriter struct {
	t  testing.TB
	on bool
}

func (w logWriter) Write(p []byte) (int, error) {
	if w.on {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// PollInterval is how often Eventually checks its condition.
const PollInterval = 10 * time.Millisecond

// Eventually polls cond every PollInterval until it returns true, and fails
// the test (t.Fatalf, so call it from the test's goroutine) once d has
// passed, naming what it waited for. cond runs at least once, on the
// calling goroutine.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(PollInterval)
	}
}

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

// WriteScript writes an executable shell script (body after "#!/bin/sh"),
// e.g. standing in for a runtime binary, and returns its path.
func WriteScript(t testing.TB, body string) string {
	t.Helper()
	RequireBinary(t, "sh")
	path := filepath.Join(t.TempDir(), "l9v-fake-runtime")
	InstallScript(t, path, body)
	return path
}

// InstallScript puts an executable shell script at path through another
// process. Written from this one, a parallel test's fork could inherit the
// open file between its fork and exec, and running the script would then
// fail with "text file busy".
func InstallScript(t testing.TB, path, body string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(src, []byte("#!/bin/sh\n"+body+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("install", "-m", "0755", src, path).CombinedOutput(); err != nil {
		t.Fatalf("install %s: %v %s", path, err, out)
	}
}

// CheckErr fails unless err contains want, or is nil when want is "".
func CheckErr(t testing.TB, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Fatalf("no error, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q, want it to contain %q", err, want)
	}
}
