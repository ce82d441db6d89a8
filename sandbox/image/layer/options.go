package layer

import (
	"archive/tar"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// Options tune FromUpper and FromCopy.
type Options struct {
	// Exclude lists absolute container paths (mount points the sandbox
	// creates, such as /proc, /sys, /dev, /etc/resolv.conf, /etc/hosts,
	// /etc/hostname, /run/levers9) left out of the layer together with
	// everything under them. Their parent directories stay in.
	Exclude []string
	// Epoch is every entry's mtime, atime and ctime (SOURCE_DATE_EPOCH),
	// truncated to whole seconds. The zero value means Unix 0.
	Epoch time.Time
	// Lookup, for FromCopy, returns the image's own entry at an absolute
	// path without following a final symlink, or nil when the image has
	// none. The directories a copy creates without carrying them (dst's
	// parents, dst) take their mode and owner from it, so /tmp keeps 1777
	// and /home/app its owner; a symlink or file there is refused. Nil
	// means root-owned 0755 directories.
	Lookup func(path string) (*tar.Header, error)
}

// SandboxExcludes are the paths a levers9 sandbox mounts over or creates
// in every container; a build step's layer leaves them out.
var SandboxExcludes = []string{"/proc", "/sys", "/dev", "/etc/resolv.conf", "/etc/hosts", "/etc/hostname", "/run/levers9"}

// epoch returns the normalised time of every entry.
func (o Options) epoch() time.Time {
	return normEpoch(o.Epoch)
}

func normEpoch(t time.Time) time.Time {
	if t.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return t.Truncate(time.Second).UTC()
}

// excluder answers whether a clean relative path is excluded.
type excluder []string

func newExcluder(paths []string) (excluder, error) {
	var out excluder
	var bad []string
	for i, p := range paths {
		if !strings.HasPrefix(p, "/") {
			bad = append(bad, fmt.Sprintf("exclude[%d] %q: not an absolute path", i, p))
			continue
		}
		c := path.Clean(p)
		if c == "/" {
			out = append(out, "")
			continue
		}
		out = append(out, strings.TrimPrefix(c, "/"))
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%s: %w", strings.Join(bad, "; "), errdefs.ErrInvalidArgument)
	}
	return out, nil
}

// excluded reports whether rel (clean, relative, no leading slash) is at or
// below an excluded path.
func (e excluder) excluded(rel string) bool {
	for _, x := range e {
		if x == "" || rel == x || strings.HasPrefix(rel, x+"/") {
			return true
		}
	}
	return false
}

// header returns a tar header with the fields every entry of this package
// shares: PAX format, empty user and group names, all times the epoch.
func header(name string, typ byte, mode int64, uid, gid int, epoch time.Time) *tar.Header {
	return &tar.Header{
		Name: name, Typeflag: typ, Mode: mode, Uid: uid, Gid: gid,
		ModTime: epoch, AccessTime: epoch, ChangeTime: epoch,
		Format: tar.FormatPAX,
	}
}
