package localstack

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/procstat"
	"github.com/levers9/levers9/internal/testenv"
)

// A process make up started and released that then died is a zombie until
// make up exits: it must count as dead at once, so a local agent that dies
// at start is reported with its own error, not after a minute's wait.
func TestPidAliveSeesAnExitedUnreapedProcess(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "x.pid")
	long := exec.Command("sleep", "30")
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = long.Process.Kill(); _ = long.Wait() })
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(long.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	if !pidAlive(pidFile) {
		t.Fatal("a running process is not alive")
	}
	short := exec.Command("sh", "-c", "exit 3")
	if err := short.Start(); err != nil {
		t.Fatal(err)
	}
	pid := short.Process.Pid
	_ = short.Process.Release() // as ensureAgent does: never reaped here
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the released process to exit", func() bool { st, err := procstat.Read(pid); return err == nil && st.Exited() })
	if pidAlive(pidFile) {
		t.Fatal("an exited, unreaped process counts as alive")
	}
	if pidAlive(filepath.Join(dir, "missing.pid")) {
		t.Fatal("a missing pid file counts as alive")
	}
}
