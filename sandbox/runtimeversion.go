package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"strings"
	"time"
)

// maxVersionOutput caps what is kept of `--version` output: the version is
// on the first lines, and a misbehaving binary must not fill memory.
const maxVersionOutput = 64 * 1024

// RuntimeVersion runs `bin --version` and returns the version from its
// "<name> version X" line. A binary that is not installed gives "" and no
// error; one that fails, hangs past timeout or prints no version line is an
// error.
func RuntimeVersion(ctx context.Context, bin, name string, timeout time.Duration) (string, error) {
	path, err := exec.LookPath(bin)
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look up %s: %w", bin, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	out := &cappedBuffer{max: maxVersionOutput}
	cmd.Stdout = out
	cmd.Stderr = out
	// A child that inherits the pipes must not keep Wait blocked after the
	// kill.
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return "", fmt.Errorf("%s --version: no answer within %v", path, timeout)
		}
		return "", fmt.Errorf("%s --version: %w (output %q)", path, err, head(out.String(), 200))
	}
	v, err := parseRuntimeVersion(name, out.String())
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	return v, nil
}

// parseRuntimeVersion finds the line "<name> version X..." and returns X, the
// first word after "version" ("1.1.5+ds1", "release-20231009.0").
func parseRuntimeVersion(name, out string) (string, error) {
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != name || fields[1] != "version" {
			continue
		}
		if len(fields) == 2 {
			return "", fmt.Errorf("%q line has no version", name+" version")
		}
		return fields[2], nil
	}
	return "", fmt.Errorf("no %q line in output %q", name+" version", head(out, 200))
}

// cappedBuffer keeps the first max bytes written and drops the rest while
// still reporting success, so the child is never blocked or killed by EPIPE.
type cappedBuffer struct {
	max int
	buf bytes.Buffer
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (b *cappedBuffer) String() string { return b.buf.String() }

// head is s cut to its first n bytes, marked when cut.
func head(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
