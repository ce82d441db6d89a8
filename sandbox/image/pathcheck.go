package image

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

const (
	maxEntryPath      = 4096
	maxEntryComponent = 255
	whiteoutPrefix    = ".wh."
	whiteoutOpaque    = ".wh..wh..opq"
)

// errUnsafeEntry is the cause of every refusal of a tar entry; callers wrap
// it with the layer digest and entry name.
var errUnsafeEntry = errors.New("unsafe layer entry")

// cleanEntryName turns a tar entry name into a clean path relative to the
// image root, or refuses it. "." means the root itself. Any ".." component is
// refused even when it would stay inside the root: legitimate layers never
// need one, and refusing is simpler to reason about than resolving.
func cleanEntryName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty name", errUnsafeEntry)
	}
	if len(name) > maxEntryPath {
		return "", fmt.Errorf("%w: name longer than %d bytes", errUnsafeEntry, maxEntryPath)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("%w: NUL byte in name", errUnsafeEntry)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: absolute path", errUnsafeEntry)
	}
	parts := make([]string, 0, strings.Count(name, "/")+1)
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return "", fmt.Errorf("%w: path traversal (..)", errUnsafeEntry)
		}
		if len(p) > maxEntryComponent {
			return "", fmt.Errorf("%w: path component longer than %d bytes", errUnsafeEntry, maxEntryComponent)
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return ".", nil
	}
	return strings.Join(parts, "/"), nil
}

// checkSymlinkTarget refuses a symlink at rel (a clean entry path) whose
// target is absolute (unless allowAbsolute) or which, resolved lexically from
// the link's directory, climbs above the root. Lexical resolution is exact
// here because unpacking never writes through a symlink: every directory on
// rel's path is a real directory.
func checkSymlinkTarget(rel, target string, allowAbsolute bool) error {
	if target == "" {
		return fmt.Errorf("%w: empty symlink target", errUnsafeEntry)
	}
	if len(target) > maxEntryPath {
		return fmt.Errorf("%w: symlink target longer than %d bytes", errUnsafeEntry, maxEntryPath)
	}
	if strings.IndexByte(target, 0) >= 0 {
		return fmt.Errorf("%w: NUL byte in symlink target", errUnsafeEntry)
	}
	if strings.HasPrefix(target, "/") {
		if allowAbsolute {
			return nil
		}
		return fmt.Errorf("%w: absolute symlink target %q", errUnsafeEntry, target)
	}
	depth := 0
	if dir := path.Dir(rel); dir != "." {
		depth = strings.Count(dir, "/") + 1
	}
	for _, p := range strings.Split(target, "/") {
		switch p {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return fmt.Errorf("%w: symlink target %q escapes the root", errUnsafeEntry, target)
			}
		default:
			depth++
		}
	}
	return nil
}

// whiteoutTarget reports whether base names a whiteout and, if so, the name
// it hides ("" for the opaque marker and for aufs bookkeeping entries,
// which are skipped).
func whiteoutTarget(base string) (hidden string, opaque, ok bool, err error) {
	if !strings.HasPrefix(base, whiteoutPrefix) {
		return "", false, false, nil
	}
	if base == whiteoutOpaque {
		return "", true, true, nil
	}
	hidden = strings.TrimPrefix(base, whiteoutPrefix)
	if strings.HasPrefix(hidden, whiteoutPrefix) {
		// aufs bookkeeping (.wh..wh.plnk and friends): nothing to apply.
		return "", false, true, nil
	}
	if hidden == "" || hidden == "." || hidden == ".." {
		return "", false, true, fmt.Errorf("%w: malformed whiteout %q", errUnsafeEntry, base)
	}
	return hidden, false, true, nil
}
