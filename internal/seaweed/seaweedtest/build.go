package seaweedtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/levers9/levers9/controlplane/agentdist"
)

// BinEnv names the environment variable pointing at a built weed binary
// (packaging/dev/test.sh sets it); Build is skipped when it is set.
const BinEnv = "LEVERS9_WEED_BIN"

// BuildScriptPath is packaging/seaweedfs/build.sh relative to the
// repository root.
const BuildScriptPath = "packaging/seaweedfs/build.sh"

// FindBin returns $LEVERS9_WEED_BIN when set, else builds weed with the
// build script of the levers9 checkout above dir (instant when cached,
// 7-10 minutes cold) and returns its path.
func FindBin(ctx context.Context, dir string) (string, error) {
	if p := os.Getenv(BinEnv); p != "" {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("$%s=%s is not an executable file", BinEnv, p)
		}
		return p, nil
	}
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("finding %s: %w", BuildScriptPath, err)
	}
	root, ok := agentdist.FindSource(d)
	if !ok {
		return "", fmt.Errorf("finding %s: no levers9 repository above %s", BuildScriptPath, dir)
	}
	script := filepath.Join(root, BuildScriptPath)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building weed with %s: %w: %s", script, err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	return lines[len(lines)-1], nil
}
