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
	dir, err := os.MkdirTemp("", "l9e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	// Stamped as a release is, so the join test can see the agent's
	// version travel through enroll and heartbeat to `machine list`.
	cmd := exec.Command("go", "build", "-ldflags", stampFlags, "-o", dir+"/", "./cmd/levers9", "./cmd/levers9-agent")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build binaries: %v\n%s", err, out)
		return 1
	}
	bin = dir
	return controlplanetest.Main(m, &env)
}
