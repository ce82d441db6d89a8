package layer

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
)

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	paxXattr       = "SCHILY.xattr."
)

// resolveFlags keep every lookup below the directory it starts from, refuse
// symlinks on the way and refuse crossing into another mount.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// FromUpper writes a reproducible, uncompressed tar of the overlayfs upper
// directory upperDir to w, the diff a build step made:
//
//   - overlay whiteouts (0:0 character devices) become OCI whiteouts
//     ".wh.<name>"; a directory whose trusted.overlay.opaque (or
//     user.overlay.opaque) xattr is "y" is followed at once by a
//     ".wh..wh..opq" entry; any other device node is refused with an error
//     naming it, and sockets are left out (a tar cannot hold one);
//   - entries come in walk order, each directory's entries sorted by their
//     name in the tar, parents before children, the upper directory itself
//     left out; uid, gid and mode (with setuid, setgid, sticky) are kept,
//     user and group names are empty, mtime, atime and ctime are the epoch;
//   - xattrs are kept as PAX SCHILY.xattr.* records, except overlay's own
//     (trusted.overlay.*, user.overlay.*) and security.selinux;
//   - regular files linked more than once within the upper directory become
//     tar hard links to the first of their paths in that order; symlinks are
//     kept as they are, never followed;
//   - paths in opts.Exclude are left out with everything under them; a
//     directory overlay copied up only as their parent stays in, as does
//     every other copied-up parent (it is part of the diff).
//
// Entries named ".wh.*" in the upper directory and overlay's redirect_dir and
// metacopy xattrs are refused: the diff could not be expressed faithfully.
// The upper directory must not change while FromUpper reads it (unmount
// the overlay or stop the step's container first).
func FromUpper(ctx context.Context, upperDir string, w io.Writer, opts Options) error {
	ex, err := newExcluder(opts.Exclude)
	if err != nil {
		return fmt.Errorf("layer from upper %s: %w", upperDir, err)
	}
	fd, err := unix.Open(upperDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("layer from upper %s: open: %w", upperDir, err)
	}
	root := os.NewFile(uintptr(fd), upperDir)
	defer root.Close()
	u := &upperWalker{ctx: ctx, tw: tar.NewWriter(w), ex: ex, epoch: opts.epoch(), links: map[inodeKey]string{}}
	if err := u.walkDir(root, ""); err != nil {
		return fmt.Errorf("layer from upper %s: %w", upperDir, err)
	}
	if err := u.tw.Close(); err != nil {
		return fmt.Errorf("layer from upper %s: %w", upperDir, err)
	}
	return nil
}

type inodeKey struct{ dev, ino uint64 }

type upperWalker struct {
	ctx   context.Context
	tw    *tar.Writer
	ex    excluder
	epoch time.Time
	// links maps an inode with more than one link to the first path
	// written for it.
	links map[inodeKey]string
}

type upperChild struct {
	name     string // on disk
	emit     string // in the tar
	st       unix.Stat_t
	whiteout bool
}

func join(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// walkDir writes the entries of dir (the directory at rel) and, depth first,
// of its subdirectories.
func (u *upperWalker) walkDir(dir *os.File, rel string) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("list %q: %w", "/"+rel, err)
	}
	dfd := int(dir.Fd())
	kids := make([]upperChild, 0, len(names))
	for _, n := range names {
		r := join(rel, n)
		if u.ex.excluded(r) {
			continue
		}
		c := upperChild{name: n, emit: n}
		if err := unix.Fstatat(dfd, n, &c.st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %q: %w", "/"+r, err)
		}
		if c.st.Mode&unix.S_IFMT == unix.S_IFCHR && c.st.Rdev == 0 {
			c.whiteout, c.emit = true, whiteoutPrefix+n
		} else if strings.HasPrefix(n, whiteoutPrefix) {
			return fmt.Errorf("%q: the name is reserved for whiteouts: %w", "/"+r, errdefs.ErrInvalidArgument)
		}
		kids = append(kids, c)
	}
	slices.SortFunc(kids, func(a, b upperChild) int { return strings.Compare(a.emit, b.emit) })
	for _, c := range kids {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		if err := u.entry(dfd, rel, c); err != nil {
			return err
		}
	}
	return nil
}

func (u *upperWalker) entry(dfd int, rel string, c upperChild) error {
	r := join(rel, c.name)
	if c.whiteout {
		return u.write(header(join(rel, c.emit), tar.TypeReg, 0, 0, 0, u.epoch), nil, r)
	}
	mode := int64(c.st.Mode & 0o7777)
	uid, gid := int(c.st.Uid), int(c.st.Gid)
	switch c.st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		f, err := openChild(dfd, c, unix.O_RDONLY|unix.O_DIRECTORY, r)
		if err != nil {
			return err
		}
		defer f.Close()
		xattrs, opaque, err := fileXattrs(int(f.Fd()), r)
		if err != nil {
			return err
		}
		hdr := header(r+"/", tar.TypeDir, mode, uid, gid, u.epoch)
		hdr.PAXRecords = xattrs
		if err := u.write(hdr, nil, r); err != nil {
			return err
		}
		if opaque {
			if err := u.write(header(r+"/"+whiteoutOpaque, tar.TypeReg, 0, 0, 0, u.epoch), nil, r); err != nil {
				return err
			}
		}
		return u.walkDir(f, r)
	case unix.S_IFREG:
		key := inodeKey{uint64(c.st.Dev), c.st.Ino}
		if c.st.Nlink > 1 {
			if first, ok := u.links[key]; ok {
				hdr := header(r, tar.TypeLink, mode, uid, gid, u.epoch)
				hdr.Linkname = first
				return u.write(hdr, nil, r)
			}
			u.links[key] = r
		}
		f, err := openChild(dfd, c, unix.O_RDONLY, r)
		if err != nil {
			return err
		}
		defer f.Close()
		xattrs, _, err := fileXattrs(int(f.Fd()), r)
		if err != nil {
			return err
		}
		hdr := header(r, tar.TypeReg, mode, uid, gid, u.epoch)
		hdr.PAXRecords = xattrs
		hdr.Size = c.st.Size
		return u.write(hdr, f, r)
	case unix.S_IFLNK:
		target, err := readlinkat(dfd, c.name)
		if err != nil {
			return fmt.Errorf("readlink %q: %w", "/"+r, err)
		}
		xattrs, _, err := linkXattrs(dfd, c.name, r)
		if err != nil {
			return err
		}
		hdr := header(r, tar.TypeSymlink, mode, uid, gid, u.epoch)
		hdr.Linkname = target
		hdr.PAXRecords = xattrs
		return u.write(hdr, nil, r)
	case unix.S_IFIFO:
		xattrs, _, err := linkXattrs(dfd, c.name, r)
		if err != nil {
			return err
		}
		hdr := header(r, tar.TypeFifo, mode, uid, gid, u.epoch)
		hdr.PAXRecords = xattrs
		return u.write(hdr, nil, r)
	case unix.S_IFSOCK:
		return nil
	default:
		return fmt.Errorf("%q: device node %d:%d in the upper directory; refusing to put it in a layer: %w",
			"/"+r, unix.Major(c.st.Rdev), unix.Minor(c.st.Rdev), errdefs.ErrInvalidArgument)
	}
}

// write writes hdr and, for a regular file, exactly hdr.Size bytes of body.
func (u *upperWalker) write(hdr *tar.Header, body io.Reader, rel string) error {
	if len(hdr.PAXRecords) == 0 {
		hdr.PAXRecords = nil
	}
	if err := u.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write %q: %w", "/"+rel, err)
	}
	if body != nil && hdr.Size > 0 {
		if _, err := io.CopyN(u.tw, body, hdr.Size); err != nil {
			return fmt.Errorf("copy %q (%d bytes; did it change while read?): %w", "/"+rel, hdr.Size, err)
		}
	}
	return nil
}

// openChild opens c beneath dfd without following symlinks or leaving the
// mount, and checks it is the inode that was listed.
func openChild(dfd int, c upperChild, flags int, rel string) (*os.File, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat2(dfd, c.name, &unix.OpenHow{Flags: uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC), Resolve: resolveFlags})
		if !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %q: %w", "/"+rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %q: %w", "/"+rel, err)
	}
	if st.Dev != c.st.Dev || st.Ino != c.st.Ino || st.Size != c.st.Size {
		f.Close()
		return nil, fmt.Errorf("%q changed while the layer was written: %w", "/"+rel, errdefs.ErrFailedPrecondition)
	}
	return f, nil
}

func readlinkat(dfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
