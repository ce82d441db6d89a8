package layer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
)

// fileXattrs reads the xattrs of an open file or directory: the PAX records
// to keep, and whether overlay marked it opaque.
func fileXattrs(fd int, rel string) (map[string]string, bool, error) {
	return readXattrs(rel,
		func(b []byte) (int, error) { return unix.Flistxattr(fd, b) },
		func(n string, b []byte) (int, error) { return unix.Fgetxattr(fd, n, b) })
}

// linkXattrs reads the xattrs of a symlink or FIFO (which cannot be opened
// for reading without following or blocking) through the directory's fd:
// /proc/self/fd/N names the directory itself, and the l* calls do not
// follow the final component.
func linkXattrs(dfd int, name, rel string) (map[string]string, bool, error) {
	p := "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + name
	return readXattrs(rel,
		func(b []byte) (int, error) { return unix.Llistxattr(p, b) },
		func(n string, b []byte) (int, error) { return unix.Lgetxattr(p, n, b) })
}

func readXattrs(rel string, list func([]byte) (int, error), get func(string, []byte) (int, error)) (map[string]string, bool, error) {
	names, err := xattrBuf(func(b []byte) (int, error) { return list(b) })
	if errors.Is(err, unix.ENOTSUP) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("list xattrs of %q: %w", "/"+rel, err)
	}
	var recs map[string]string
	opaque := false
	for _, n := range strings.Split(string(names), "\x00") {
		if n == "" {
			continue
		}
		v, err := xattrBuf(func(b []byte) (int, error) { return get(n, b) })
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("read xattr %s of %q: %w", n, "/"+rel, err)
		}
		if ovl, ok := overlayXattr(n); ok {
			switch ovl {
			case "opaque":
				opaque = opaque || string(v) == "y"
			case "redirect", "metacopy":
				return nil, false, fmt.Errorf("%q carries overlay's %s xattr: mount the step's overlay with redirect_dir=off,metacopy=off: %w", "/"+rel, ovl, errdefs.ErrFailedPrecondition)
			}
			continue
		}
		if n == "security.selinux" {
			continue
		}
		if recs == nil {
			recs = map[string]string{}
		}
		recs[paxXattr+n] = string(v)
	}
	return recs, opaque, nil
}

// overlayXattr returns the name of an overlayfs bookkeeping xattr
// ("opaque", "origin", ...) in either namespace.
func overlayXattr(n string) (string, bool) {
	if s, ok := strings.CutPrefix(n, "trusted.overlay."); ok {
		return s, true
	}
	if s, ok := strings.CutPrefix(n, "user.overlay."); ok {
		return s, true
	}
	return "", false
}

// xattrBuf calls f with a growing buffer until the answer fits.
func xattrBuf(f func([]byte) (int, error)) ([]byte, error) {
	for {
		n, err := f(nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		buf := make([]byte, n)
		m, err := f(buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:m], nil
	}
}
