package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/testenv"
)

// TestPoolJoinDev joins a box directly with `levers9 pool join default
// --dev`: the controlplane builds the agent from this checkout and the box
// runs the binary it was handed.
func TestPoolJoinDev(t *testing.T) {
	w := setupJoinWorldWith(t, func(c *controlplanetestConfig) { c.Controlplane.AgentDevBuilds = true })
	root := t.TempDir()
	out := &testenv.SyncBuffer{}
	cmd := exec.Command("ip", "netns", "exec", w.box.ns, filepath.Join(bin, "levers9"), "pool", "join", "default", "--dev", "--foreground",
		"--state-dir", filepath.Join(root, "state"), "--etc-dir", filepath.Join(root, "etc"), "--bin-dir", filepath.Join(root, "bin"))
	cmd.Env = append(os.Environ(), "LEVERS9_HOME="+w.home)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	controlplanetest.Eventually(t, 3*time.Minute, "the box online through pool join --dev\n"+out.String(), func() bool {
		ms := w.machines(t)
		return len(ms) == 1 && ms[0].State == "MACHINE_STATE_ONLINE"
	})
	installed, err := os.ReadFile(filepath.Join(root, "bin", "levers9-agent"))
	if err != nil {
		t.Fatal(err)
	}
	prebuilt, _ := os.ReadFile(filepath.Join(bin, "levers9-agent"))
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	script, _ := os.ReadFile(filepath.Join(w.home, "machines", w.machines(t)[0].ID+".sh"))
	if !strings.Contains(string(script), sum(installed)) || !strings.Contains(string(script), "?dev=1") {
		t.Error("the script does not pin the dev build it installed")
	}
	if len(prebuilt) > 0 && sum(prebuilt) == sum(installed) {
		t.Log("the dev build is byte-identical to the prebuilt agent (same source, same flags)")
	}
}
