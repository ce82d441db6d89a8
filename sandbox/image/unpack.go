package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
)

// ErrUnsafeLayer marks a layer refused because one of its entries could
// escape the image root or create something a container must not have
// (traversal, absolute path, device node, escaping link, write through a
// symlink). The error names the layer digest and the entry.
var ErrUnsafeLayer = errUnsafeEntry

// paxCapability carries a file's security.capability xattr in a tar.
const paxCapability = "SCHILY.xattr.security.capability"

// resolveFlags confine every lookup to the root and refuse symlinks on the
// way: the unpacker never follows a link, so a link planted by one entry (or
// an earlier layer) cannot redirect a later write.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// layerApplier applies one layer's entries onto the directory being built.
// It is used by one goroutine.
type layerApplier struct {
	rootPath      string
	root          int // O_PATH fd of rootPath, owned by the caller
	layer         string
	allowAbsLinks bool
	// limit is how many file bytes this layer may still write.
	limit int64
	// chown is false when not root (a developer's laptop): ownership from
	// the layer cannot be applied and files stay the caller's.
	chown bool
	// written holds every path this layer created (and their ancestors), so
	// an opaque whiteout removes only what earlier layers left.
	written map[string]bool
	size    int64
}

// applyLayer reads a (possibly gzip or zstd compressed) tar stream and
// applies it onto root, copying the uncompressed bytes to diff (for the
// diff_id check). Errors name the layer and entry.
func applyLayer(ctx context.Context, rootPath string, root int, layer string, r io.Reader, allowAbsLinks bool, limit int64, diff io.Writer) (int64, error) {
	raw, closeDec, err := decompress(r)
	if err != nil {
		return 0, fmt.Errorf("layer %s: decompress: %w", layer, err)
	}
	defer closeDec()
	dec := io.TeeReader(raw, diff)
	a := &layerApplier{rootPath: rootPath, root: root, layer: layer, allowAbsLinks: allowAbsLinks, limit: limit, chown: os.Geteuid() == 0, written: map[string]bool{}}
	tr := tar.NewReader(dec)
	for {
		if err := ctx.Err(); err != nil {
			return a.size, fmt.Errorf("layer %s: %w", layer, err)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return a.size, fmt.Errorf("layer %s: read tar: %w", layer, err)
		}
		if err := a.apply(hdr, tr); err != nil {
			return a.size, fmt.Errorf("layer %s: entry %q: %w", layer, hdr.Name, err)
		}
	}
	// Drain the padding so the caller's digest check sees every byte.
	if _, err := io.Copy(io.Discard, dec); err != nil {
		return a.size, fmt.Errorf("layer %s: read trailer: %w", layer, err)
	}
	return a.size, nil
}

func decompress(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		return gz, func() { _ = gz.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	default:
		return br, func() {}, nil
	}
}

func (a *layerApplier) apply(hdr *tar.Header, body io.Reader) error {
	rel, err := cleanEntryName(hdr.Name)
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader, tar.TypeXHeader:
		return nil
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("%w: device node", errUnsafeEntry)
	}
	if rel == "." {
		// The root's own entry: keep the cache's 0755 root.
		return nil
	}
	dir, base := path.Dir(rel), path.Base(rel)
	hidden, opaque, isWhiteout, err := whiteoutTarget(base)
	if err != nil {
		return err
	}
	if isWhiteout {
		switch {
		case opaque:
			return a.opaque(dir)
		case hidden != "":
			return a.whiteout(dir, hidden)
		}
		return nil
	}

	dfd, err := a.openDir(dir, true)
	if err != nil {
		return err
	}
	defer a.closeDir(dfd)
	perm := uint32(hdr.Mode) & 0o7777

	switch hdr.Typeflag {
	case tar.TypeDir:
		err = a.mkdir(dfd, dir, base, hdr, perm)
	case tar.TypeReg: // archive/tar already turns TypeRegA into TypeReg.
		err = a.writeFile(dfd, dir, base, hdr, perm, body)
	case tar.TypeSymlink:
		if err := checkSymlinkTarget(rel, hdr.Linkname, a.allowAbsLinks); err != nil {
			return err
		}
		if err := a.removeExisting(dfd, dir, base); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, dfd, base); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
		if a.chown {
			err = unix.Fchownat(dfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
		}
	case tar.TypeLink:
		err = a.hardlink(dfd, dir, base, rel, hdr.Linkname)
	case tar.TypeFifo:
		if err := a.removeExisting(dfd, dir, base); err != nil {
			return err
		}
		if err := unix.Mknodat(dfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return fmt.Errorf("mkfifo: %w", err)
		}
		err = a.chownChmod(dfd, base, hdr, perm)
	default:
		return fmt.Errorf("%w: unsupported entry type %q", errUnsafeEntry, string(hdr.Typeflag))
	}
	if err != nil {
		return err
	}
	for p := rel; p != "."; p = path.Dir(p) {
		a.written[p] = true
	}
	return nil
}

// openDir opens the directory rel beneath the root one component at a time,
// refusing any component that is a symlink or not a directory; with create
// it makes missing components 0755 (tar streams may omit parents). The
// returned fd is a.root for "." and must be released with closeDir.
func (a *layerApplier) openDir(rel string, create bool) (int, error) {
	if rel == "." {
		return a.root, nil
	}
	cur := a.root
	walked := "."
	for _, comp := range splitPath(rel) {
		walked = path.Join(walked, comp)
		fd, err := openBeneath(cur, comp, unix.O_PATH|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) && create {
			if err := unix.Mkdirat(cur, comp, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				a.closeDir(cur)
				return -1, fmt.Errorf("mkdir parent %q: %w", walked, err)
			}
			fd, err = openBeneath(cur, comp, unix.O_PATH|unix.O_DIRECTORY)
		}
		a.closeDir(cur)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
				return -1, fmt.Errorf("%w: parent %q is a symlink or not a directory; refusing to write through it", errUnsafeEntry, walked)
			}
			return -1, fmt.Errorf("open parent %q: %w", walked, err)
		}
		cur = fd
	}
	return cur, nil
}

func (a *layerApplier) closeDir(fd int) {
	if fd >= 0 && fd != a.root {
		_ = unix.Close(fd)
	}
}

func openBeneath(dirfd int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolveFlags})
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		return fd, err
	}
}

// removeExisting removes whatever sits at dir/base so a new entry can take
// its place. dir was just resolved without symlinks, so removing by host path
// below it cannot leave the root (nothing else writes the tree meanwhile).
func (a *layerApplier) removeExisting(dfd int, dir, base string) error {
	var st unix.Stat_t
	err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat existing: %w", err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := os.RemoveAll(filepath.Join(a.rootPath, dir, base)); err != nil {
			return fmt.Errorf("remove existing directory: %w", err)
		}
		return nil
	}
	if err := unix.Unlinkat(dfd, base, 0); err != nil {
		return fmt.Errorf("remove existing: %w", err)
	}
	return nil
}

func (a *layerApplier) mkdir(dfd int, dir, base string, hdr *tar.Header, perm uint32) error {
	var st unix.Stat_t
	err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
	case err == nil || errors.Is(err, unix.ENOENT):
		if err := a.removeExisting(dfd, dir, base); err != nil {
			return err
		}
		if err := unix.Mkdirat(dfd, base, 0o700); err != nil {
			return fmt.Errorf("mkdir: %w", err)
		}
	default:
		return fmt.Errorf("stat: %w", err)
	}
	fd, err := openBeneath(dfd, base, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open directory: %w", err)
	}
	defer unix.Close(fd)
	if a.chown {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

func (a *layerApplier) writeFile(dfd int, dir, base string, hdr *tar.Header, perm uint32, body io.Reader) error {
	if hdr.Size < 0 || hdr.Size > a.limit-a.size {
		return fmt.Errorf("file of %d bytes exceeds the image's unpacked size limit: %w", hdr.Size, errdefs.ErrInvalidArgument)
	}
	if err := a.removeExisting(dfd, dir, base); err != nil {
		return err
	}
	fd, err := unix.Openat(dfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	n, err := io.CopyN(f, body, hdr.Size)
	a.size += n
	if err != nil {
		return fmt.Errorf("write %d bytes: %w", hdr.Size, err)
	}
	// chown before chmod: chown clears setuid/setgid bits.
	if a.chown {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := f.Chmod(os.FileMode(perm&0o777) | unixModeBits(perm)); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	// File capabilities are the one xattr applied (binaries such as ping
	// rely on them; the container's bounding set still caps them). Others,
	// trusted.overlay.* above all, could steer overlayfs and are dropped.
	if caps, ok := hdr.PAXRecords[paxCapability]; ok && a.chown {
		if err := unix.Fsetxattr(int(f.Fd()), "security.capability", []byte(caps), 0); err != nil {
			return fmt.Errorf("set file capabilities: %w", err)
		}
	}
	mt := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	if hdr.ModTime.IsZero() {
		mt = unix.NsecToTimespec(time.Unix(0, 0).UnixNano())
	}
	if err := unix.UtimesNanoAt(dfd, base, []unix.Timespec{mt, mt}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	return f.Close()
}

// unixModeBits maps setuid, setgid and sticky to os.FileMode's own bits.
func unixModeBits(perm uint32) os.FileMode {
	var m os.FileMode
	if perm&unix.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if perm&unix.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if perm&unix.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}

func (a *layerApplier) chownChmod(dfd int, base string, hdr *tar.Header, perm uint32) error {
	if a.chown {
		if err := unix.Fchownat(dfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := unix.Fchmodat(dfd, base, perm, 0); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

// hardlink links rel to target, both inside the root; the target's path
// must contain no symlink, and linkat without AT_SYMLINK_FOLLOW links a
// symlink itself rather than what it points at.
func (a *layerApplier) hardlink(dfd int, dir, base, rel, linkname string) error {
	target, err := cleanEntryName(linkname)
	if err != nil {
		return fmt.Errorf("hardlink target %q: %w", linkname, err)
	}
	if target == "." || target == rel {
		return fmt.Errorf("%w: hardlink to %q", errUnsafeEntry, linkname)
	}
	tdfd, err := a.openDir(path.Dir(target), false)
	if err != nil {
		if errors.Is(err, errUnsafeEntry) {
			return fmt.Errorf("hardlink target %q: %w", linkname, err)
		}
		return fmt.Errorf("%w: hardlink target %q does not exist in the image: %v", errUnsafeEntry, linkname, err)
	}
	defer a.closeDir(tdfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tdfd, path.Base(target), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%w: hardlink target %q does not exist in the image: %v", errUnsafeEntry, linkname, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("%w: hardlink to directory %q", errUnsafeEntry, linkname)
	}
	if err := a.removeExisting(dfd, dir, base); err != nil {
		return err
	}
	if err := unix.Linkat(tdfd, path.Base(target), dfd, base, 0); err != nil {
		return fmt.Errorf("link to %q: %w", linkname, err)
	}
	return nil
}

// whiteout removes dir/hidden left by an earlier layer.
func (a *layerApplier) whiteout(dir, hidden string) error {
	target := path.Join(dir, hidden)
	if a.written[target] {
		return nil
	}
	dfd, err := a.openDir(dir, false)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer a.closeDir(dfd)
	return a.removeExisting(dfd, dir, hidden)
}

// opaque empties dir of everything earlier layers put there.
func (a *layerApplier) opaque(dir string) error {
	dfd, err := a.openDir(dir, true)
	if err != nil {
		return err
	}
	defer a.closeDir(dfd)
	fd, err := openBeneath(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open opaque directory: %w", err)
	}
	f := os.NewFile(uintptr(fd), dir)
	names, err := f.Readdirnames(-1)
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("list opaque directory: %w", err)
	}
	for _, n := range names {
		if a.written[path.Join(dir, n)] {
			continue
		}
		if err := a.removeExisting(dfd, dir, n); err != nil {
			return err
		}
	}
	a.written[dir] = true
	return nil
}

func splitPath(rel string) []string {
	var out []string
	for rel != "." && rel != "" {
		out = append([]string{path.Base(rel)}, out...)
		rel = path.Dir(rel)
	}
	return out
}
