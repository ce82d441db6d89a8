package e2e

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
	// bin holds the levers9, levers9-agent binaries built once per run.
	bin string
)

// stampFlags set the version and commit the way packaging/release does;
// stampedVersion is what version.String then prints.
const (
	stampFlags     = "-X github.com/levers9/levers9/internal/version.Version=v0.0.0-e2e -X github.com/levers9/levers9/internal/version.Commit=e2e0123456789abcdef"
	stampedVersion = "v0.0.0-e2e (commit e2e012345678)"
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// Stamped as a release is, so the join test can see the agent's
	// version travel through enroll and heartbeat to `machine list`.
	dir, cleanup, err := testbox.BuildCommands(filepath.Join("..", ".."), stampFlags, "./cmd/levers9", "./cmd/levers9-agent")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	bin = dir
	return controlplanetest.Main(m, &env)
}
