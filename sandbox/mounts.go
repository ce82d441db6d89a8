package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
)

// MountValidation is worker.volumeMountValidation.
type MountValidation string

// Log reports sensitive mounts and lets them through (to switch a pool over
// safely); enforce refuses them.
const (
	MountValidationLog     MountValidation = "log"
	MountValidationEnforce MountValidation = "enforce"
)

// SensitivePaths are the host paths a user volume may never be, be under,
// or contain (besides "/", which may only not be mounted itself).
var SensitivePaths = []string{
	"/proc", "/sys", "/dev", "/etc",
	"/run/containerd", "/run/docker.sock", "/var/run/docker.sock", "/run/docker",
	"/run/runc", "/run/runsc", "/run/podman", "/run/crio", "/run/l9s",
}

// MountValidator checks user volumes against the host's sensitive paths.
// It is safe for concurrent use.
type MountValidator struct {
	Mode MountValidation
	// Extra are more sensitive paths: the agent's state directory and its
	// own socket.
	Extra  []string
	Logger *slog.Logger
}

// Violation is one refused (or, in log mode, reported) mount.
type Violation struct {
	Index    int    `json:"index"`
	Source   string `json:"source"`
	Resolved string `json:"resolved"`
	Reason   string `json:"reason"`
}

func (v Violation) Error() string {
	return fmt.Sprintf("task.mounts[%d].source: %q (resolved %q) %s", v.Index, v.Source, v.Resolved, v.Reason)
}

// Check resolves every mount source (symlinks and ".." first, so a link to
// /etc is /etc) and returns the violations. In enforce mode any violation
// is an ErrPermissionDenied error naming each mount; in log mode they are
// logged and returned with a nil error. A source that cannot be resolved is
// always an error.
func (v MountValidator) Check(ctx context.Context, taskID string, mounts []Mount) ([]Violation, error) {
	if v.Mode != MountValidationLog && v.Mode != MountValidationEnforce {
		return nil, fmt.Errorf("worker.volumeMountValidation: %q is not log or enforce: %w", v.Mode, errdefs.ErrInvalidArgument)
	}
	var denied []string
	for _, p := range append(append([]string{}, SensitivePaths...), v.Extra...) {
		denied = append(denied, resolveLoose(p))
	}
	var out []Violation
	var errs []error
	for i, m := range mounts {
		if !filepath.IsAbs(m.Source) {
			errs = append(errs, fmt.Errorf("task.mounts[%d].source: %q is not absolute: %w", i, m.Source, errdefs.ErrInvalidArgument))
			continue
		}
		res, err := filepath.EvalSymlinks(filepath.Clean(m.Source))
		if err != nil {
			errs = append(errs, fmt.Errorf("task.mounts[%d].source: resolve %q: %w: %w", i, m.Source, err, errdefs.ErrInvalidArgument))
			continue
		}
		if reason := sensitive(res, denied); reason != "" {
			out = append(out, Violation{Index: i, Source: m.Source, Resolved: res, Reason: reason})
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("task %s: %w", taskID, errors.Join(errs...))
	}
	if len(out) == 0 {
		return nil, nil
	}
	if v.Mode == MountValidationEnforce {
		errs := make([]error, len(out))
		for i := range out {
			errs[i] = out[i]
		}
		return out, fmt.Errorf("task %s: %w: %w", taskID, errdefs.ErrPermissionDenied, errors.Join(errs...))
	}
	if v.Logger != nil {
		for _, viol := range out {
			v.Logger.LogAttrs(ctx, slog.LevelWarn, "sensitive volume mount allowed in log mode",
				slog.String("task_id", taskID), slog.String("source", viol.Source), slog.String("resolved", viol.Resolved), slog.String("reason", viol.Reason))
		}
	}
	return out, nil
}

func sensitive(p string, denied []string) string {
	if p == "/" {
		return "is the host root"
	}
	for _, d := range denied {
		switch {
		case p == d:
			return "is " + d
		case strings.HasPrefix(p, d+"/"):
			return "is under " + d
		case strings.HasPrefix(d, p+"/"):
			return "contains " + d
		}
	}
	return ""
}

// resolveLoose resolves symlinks in as much of p as exists, so /var/run is
// compared as /run.
func resolveLoose(p string) string {
	p = filepath.Clean(p)
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	dir, base := filepath.Split(p)
	if dir == "/" || dir == "" {
		return p
	}
	return filepath.Join(resolveLoose(filepath.Clean(dir)), base)
}
