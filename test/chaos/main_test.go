package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/levers9/levers9/controlplane/controlplanetest"
)

var (
	env *controlplanetest.Env
	// bin holds levers9, levers9-agent and levers9-controlplane, built once.
	bin string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		// TestChaos skips (testenv.RequireRoot); nothing to build for it.
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "l9chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	_ = os.Chmod(dir, 0o755)
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/levers9", "./cmd/levers9-agent", "./cmd/levers9-controlplane")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build binaries: %v\n%s", err, out)
		return 1
	}
	bin = dir
	return controlplanetest.Main(m, &env)
}
