package kubecluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/levers9/levers9/controlplane/agentdist"
)

// BuildScriptPath is packaging/kube/build.sh relative to the repository root.
const BuildScriptPath = "packaging/kube/build.sh"

// FindBuildScript walks up from dir to the repository root of
// github.com/levers9/levers9 and returns the path of its build.sh.
func FindBuildScript(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("finding %s from %s: %w", BuildScriptPath, dir, err)
	}
	root, ok := agentdist.FindSource(d)
	if !ok {
		return "", fmt.Errorf("finding %s: no levers9 repository above %s", BuildScriptPath, dir)
	}
	p := filepath.Join(root, BuildScriptPath)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("finding the kube build script: %w", err)
	}
	return p, nil
}

// Build runs build.sh (cached: instant when warm, 10-30 minutes cold) and
// returns the directory holding the binaries and stages.yaml. The script's
// progress goes to progress when it is not nil.
func Build(ctx context.Context, script string, progress io.Writer) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if progress != nil {
		cmd.Stderr = io.MultiWriter(&stderr, progress)
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building the control plane with %s: %w: %s", script, err, lastLines(stderr.String(), 20))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := lines[len(lines)-1]
	if err := checkBinDir(dir); err != nil {
		return "", fmt.Errorf("building the control plane with %s: %w", script, err)
	}
	return dir, nil
}

// binaries are the files a bin dir must hold.
var binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "stages.yaml"}

func checkBinDir(dir string) error {
	if dir == "" {
		return errors.New("no binary directory")
	}
	var missing []string
	for _, b := range binaries {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Size() == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("binary directory %s lacks %s", dir, strings.Join(missing, ", "))
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
