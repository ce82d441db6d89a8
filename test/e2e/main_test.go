package e2e

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
	// bin holds the levers9, levers9-agent binaries built once per run.
	bin string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "l9e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/levers9", "./cmd/levers9-agent")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build binaries: %v\n%s", err, out)
		return 1
	}
	bin = dir
	return controlplanetest.Main(m, &env)
}
