package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/testbox"
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
	dir, cleanup, err := testbox.BuildCommands(filepath.Join("..", ".."), "", "./cmd/levers9", "./cmd/levers9-agent", "./cmd/levers9-controlplane")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	bin = dir
	return controlplanetest.Main(m, &env)
}
