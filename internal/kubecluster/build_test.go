package kubecluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
)

// fakeGo stands in for the go command so build.sh's caching can be tested
// without a 20-minute build: `go version` prints a fixed line, `go build -o
// DIR/ PKG...` writes one small file per package, after FAKE_GO_SLEEP
// seconds when set.
const fakeGo = `#!/bin/sh
case "$1" in
version) echo "go version go0.0-fake linux/amd64"; exit 0 ;;
build) ;;
*) exit 0 ;;
esac
[ -n "$FAKE_GO_SLEEP" ] && sleep "$FAKE_GO_SLEEP"
while [ $# -gt 0 ]; do
  case "$1" in
  -o) out="$2"; shift 2 ;;
  -ldflags) shift 2 ;;
  -*) shift ;;
  *) echo bin >"$out/$(basename "$1")"; shift ;;
  esac
done
`

func TestBuildScriptCache(t *testing.T) {
	script, err := FindBuildScript(".")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(fakeGo), 0o755); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	env := append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "XDG_CACHE_HOME="+cache)
	root := filepath.Join(cache, "levers9", "kube")

	// A build killed half-way leaves no key directory.
	killed := exec.Command("bash", script)
	killed.Env = append(env, "FAKE_GO_SLEEP=30")
	killed.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := killed.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the build to make its temporary directory", func() bool {
		m, _ := filepath.Glob(filepath.Join(root, ".tmp-*"))
		return len(m) == 1
	})
	_ = syscall.Kill(-killed.Process.Pid, syscall.SIGKILL)
	_ = killed.Wait()
	if dirs, _ := filepath.Glob(filepath.Join(root, "[0-9a-f]*")); len(dirs) != 0 {
		t.Fatalf("a killed build left %v", dirs)
	}

	run := func() (string, time.Duration) {
		t.Helper()
		cmd := exec.Command("bash", script)
		cmd.Env = env
		start := time.Now()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("build.sh: %v", err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return lines[len(lines)-1], time.Since(start)
	}
	dir, _ := run()
	if filepath.Dir(dir) != root {
		t.Fatalf("build.sh printed %s, want a directory in %s", dir, root)
	}
	if err := checkBinDir(dir); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(root, ".tmp-*")); len(left) != 0 {
		t.Errorf("the killed build's %v is still there", left)
	}

	// Warm: the same directory, nothing built (a build would sleep 30 s).
	env = append(env, "FAKE_GO_SLEEP=30")
	again, took := run()
	if again != dir {
		t.Errorf("warm run printed %s, want %s", again, dir)
	}
	if took > 2*time.Second {
		t.Errorf("warm run took %v", took)
	}
	t.Logf("warm run: %v", took)
}
