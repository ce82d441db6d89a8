package recipe

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// ErrTooLarge is returned (wrapped) by TarSource when the tar would exceed
// its maxBytes.
var ErrTooLarge = errors.New("copy source too large")

// TarSource writes a deterministic tar of the local file or directory src
// to w, for a copy step, and returns the sha256 digest ("sha256:<hex>") and
// size of what it wrote.
//
// A directory's entries are named relative to src (the directory itself has
// no entry), depth first in byte order of names, directories with a trailing
// slash; a single file becomes one entry with its base name. Every entry has
// uid and gid 0, no user or group name, mtime Unix 0 and only its
// permission bits (setuid, setgid and sticky are dropped). Symlinks,
// including src itself, are kept as symlinks and never followed; hard links
// become separate regular files. Devices, fifos and sockets are refused with
// an error naming the path.
//
// maxBytes (> 0) bounds the tar's size: TarSource never writes more and
// fails with ErrTooLarge. On any error w may hold a partial tar, which the
// caller discards. Equal trees give equal bytes, whatever their times and
// owners on disk.
func TarSource(ctx context.Context, src string, w io.Writer, maxBytes int64) (digest string, size int64, err error) {
	if maxBytes <= 0 {
		return "", 0, fmt.Errorf("tar %s: maxBytes must be positive, got %d", src, maxBytes)
	}
	root, err := os.Lstat(src)
	if err != nil {
		return "", 0, fmt.Errorf("tar: %w", err)
	}
	lw := &limitedWriter{w: w, h: sha256.New(), max: maxBytes}
	tw := tar.NewWriter(lw)
	t := &tarrer{ctx: ctx, tw: tw, max: maxBytes}
	if root.IsDir() {
		err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p == src {
				return nil
			}
			rel, err := filepath.Rel(src, p)
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			return t.add(p, filepath.ToSlash(rel), fi)
		})
	} else {
		err = t.add(src, filepath.Base(src), root)
	}
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		if errors.Is(err, ErrTooLarge) {
			return "", 0, fmt.Errorf("tar %s: %w: more than %d bytes", src, ErrTooLarge, maxBytes)
		}
		return "", 0, err
	}
	return "sha256:" + hex.EncodeToString(lw.h.Sum(nil)), lw.n, nil
}

type tarrer struct {
	ctx context.Context
	tw  *tar.Writer
	max int64
}

var zeroTime = time.Unix(0, 0)

// add writes the entry for the file at p (described by fi, from Lstat) as
// name.
func (t *tarrer) add(p, name string, fi fs.FileInfo) error {
	if err := t.ctx.Err(); err != nil {
		return err
	}
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(fi.Mode().Perm()),
		ModTime: zeroTime,
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		hdr.Typeflag = tar.TypeReg
		hdr.Size = fi.Size()
		if hdr.Size > t.max {
			return ErrTooLarge
		}
	case m.IsDir():
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case m&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return fmt.Errorf("tar: %w", err)
		}
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = target
	default:
		return fmt.Errorf("tar %s: %s not supported (only regular files, directories and symlinks can be copied)", p, fileKind(m))
	}
	if err := t.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("tar %s: %w", p, err)
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("tar: %w", err)
	}
	defer f.Close()
	// The file must still be the one Lstat saw (not swapped for a symlink
	// or a fifo in between) and as long.
	if now, err := f.Stat(); err != nil {
		return fmt.Errorf("tar: %w", err)
	} else if !os.SameFile(fi, now) || now.Size() != fi.Size() {
		return fmt.Errorf("tar %s: changed while taring", p)
	}
	n, err := io.Copy(t.tw, ctxReader{t.ctx, io.LimitReader(f, fi.Size())})
	if err != nil {
		if errors.Is(err, ErrTooLarge) || t.ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("tar %s: %w", p, err)
	}
	if n != fi.Size() {
		return fmt.Errorf("tar %s: changed while taring (read %d of %d bytes)", p, n, fi.Size())
	}
	return nil
}

func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a fifo"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "an irregular file (" + m.Type().String() + ")"
}

// limitedWriter hashes and counts what it passes on, and refuses (without
// writing) a write that would go past max.
type limitedWriter struct {
	w   io.Writer
	h   hash.Hash
	n   int64
	max int64
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n+int64(len(p)) > l.max {
		return 0, ErrTooLarge
	}
	n, err := l.w.Write(p)
	l.h.Write(p[:n])
	l.n += int64(n)
	return n, err
}

// ctxReader stops reading when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
