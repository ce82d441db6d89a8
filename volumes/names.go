package volumes

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
)

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateName checks a volume name: 1-63 lowercase letters, digits and
// dashes, starting and ending with a letter or digit (a DNS label, so a
// name is safe in paths, URLs and labels).
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("volume name %q: want 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// deniedTargets are container paths a volume may not be mounted over or
// under (worker.volumeMountValidation): the kernel's and the runtime's own
// filesystems and the container's identity.
var deniedTargets = []string{"/proc", "/sys", "/dev", "/etc", "/run/secrets", "/bin", "/sbin", "/usr", "/lib", "/lib64", "/boot"}

// ValidateTarget checks that a container path for a volume is absolute
// and clean. Whether it is a safe place is UnsafeTarget's question, since
// volume mount validation may only report it (log mode).
func ValidateTarget(p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("volume path %q: not absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	if path.Clean(p) != p {
		return fmt.Errorf("volume path %q: not clean (want %q): %w", p, path.Clean(p), errdefs.ErrInvalidArgument)
	}
	return nil
}

// UnsafeTarget says why a clean, absolute container path is no place for
// a volume ("over /proc", "the container's root"), or "" when it is one:
// "/", and on, under or above /proc, /sys, /dev, /etc, /run/secrets and
// the system directories.
func UnsafeTarget(p string) string {
	if p == "/" {
		return "the container's root"
	}
	for _, d := range deniedTargets {
		if p == d || strings.HasPrefix(p, d+"/") || strings.HasPrefix(d, p+"/") {
			return "over " + d
		}
	}
	return ""
}

// Ref is a task's request for a volume: NAME:/path[:ro].
type Ref struct {
	Name     string
	Path     string
	ReadOnly bool
}

// ParseRef parses NAME:/path or NAME:/path:ro (or :rw) and validates both.
func ParseRef(s string) (Ref, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return Ref{}, fmt.Errorf("volume %q: want NAME:/path[:ro]: %w", s, errdefs.ErrInvalidArgument)
	}
	r := Ref{Name: parts[0], Path: parts[1]}
	if len(parts) == 3 {
		switch parts[2] {
		case "ro":
			r.ReadOnly = true
		case "rw":
		default:
			return Ref{}, fmt.Errorf("volume %q: mode %q is not ro or rw: %w", s, parts[2], errdefs.ErrInvalidArgument)
		}
	}
	return r, r.Validate()
}

// Validate checks the name and the path, reporting both problems at once.
func (r Ref) Validate() error {
	return errors.Join(ValidateName(r.Name), ValidateTarget(r.Path))
}

// String is NAME:/path[:ro].
func (r Ref) String() string {
	s := r.Name + ":" + r.Path
	if r.ReadOnly {
		s += ":ro"
	}
	return s
}

// ParseSize parses a size: a byte count with an optional K, M, G, T (powers
// of 1024, with or without "i" and "B": 10G, 10GiB, 512Mi, 1024).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "i")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K', 'k':
			mult = 1 << 10
		case 'M', 'm':
			mult = 1 << 20
		case 'G', 'g':
			mult = 1 << 30
		case 'T', 't':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want a number with an optional K, M, G or T: %w", s, errdefs.ErrInvalidArgument)
	}
	return v * mult, nil
}

// FormatSize renders bytes for people: 0, 512 B, 1.5 KiB, 10.0 GiB.
func FormatSize(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

// CleanFilePath cleans a path inside a volume, given relative to its root
// ("", "/" and "." are the root), and returns it with a leading "/". A path
// that climbs out of the volume ("..", "a/../../b") is refused rather than
// clamped to the root, so a typo never lands a file somewhere unexpected.
func CleanFilePath(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("volume path %q: contains a NUL byte: %w", p, errdefs.ErrInvalidArgument)
	}
	rel := strings.TrimLeft(p, "/")
	if rel == "" {
		return "/", nil
	}
	// Cleaned relative, a path that escapes starts with "..".
	c := path.Clean(rel)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("volume path %q: leaves the volume (..): %w", p, errdefs.ErrInvalidArgument)
	}
	if c == "." {
		return "/", nil
	}
	return "/" + c, nil
}
