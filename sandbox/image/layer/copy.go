package layer

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
)

// ErrUnsafeEntry marks a copy source entry refused because it could land
// outside its destination or point at something outside its tar: a ".."
// component, an absolute name, a ".wh." name (a whiteout would delete
// files of the image below), a hard link to a path the tar did not hold
// before it, or a type a copy cannot carry (devices, FIFOs). Errors name the
// entry.
var ErrUnsafeEntry = errors.New("unsafe copy entry")

// FromCopy writes to w the layer of a copy step: the entries of src (an
// uncompressed tar whose names are relative to the copied source, "." or
// "./" being the source directory itself) placed under dst, an absolute
// container directory. It writes a directory entry (0755, root) for each of
// dst's ancestors, for dst itself unless src holds "." before anything
// else, and for any parent src leaves out, each before its first child.
// Entries keep their mode (with setuid, setgid, sticky) and type; owners
// become root (0:0), user and group names empty, times the epoch, and PAX
// records (xattrs included) are dropped. Symlink targets are kept as they
// are (they resolve inside the container). It refuses, with an error
// wrapping ErrUnsafeEntry and naming the entry, names that are absolute or
// hold ".." or a ".wh." component, hard links whose target is not a regular file earlier in src,
// types other than directory, regular file, symlink and hard link, and a
// second entry for a path unless both are directories (the later one's mode
// wins). Paths in opts.Exclude are left out. The output depends only on
// src's names, modes, types, link targets and contents, and on dst.
func FromCopy(ctx context.Context, src io.Reader, dst string, w io.Writer, opts Options) error {
	if err := fromCopy(ctx, src, dst, w, opts); err != nil {
		return fmt.Errorf("layer from copy to %s: %w", dst, err)
	}
	return nil
}

func fromCopy(ctx context.Context, src io.Reader, dst string, w io.Writer, opts Options) error {
	if !strings.HasPrefix(dst, "/") || strings.IndexByte(dst, 0) >= 0 {
		return fmt.Errorf("destination %q is not an absolute path: %w", dst, errdefs.ErrInvalidArgument)
	}
	for _, p := range strings.Split(dst, "/") {
		if p == ".." {
			return fmt.Errorf("destination %q holds \"..\": %w", dst, errdefs.ErrInvalidArgument)
		}
	}
	base := strings.TrimPrefix(path.Clean(dst), "/") // "" for the root
	ex, err := newExcluder(opts.Exclude)
	if err != nil {
		return err
	}
	epoch := opts.epoch()
	tw := tar.NewWriter(w)
	kinds := map[string]byte{}
	emit := func(hdr *tar.Header, body io.Reader) error {
		rel := strings.TrimSuffix(hdr.Name, "/")
		if ex.excluded(rel) {
			return nil
		}
		if prev, ok := kinds[rel]; ok && (prev != tar.TypeDir || hdr.Typeflag != tar.TypeDir) {
			return fmt.Errorf("%w: %q appears twice", ErrUnsafeEntry, "/"+rel)
		}
		kinds[rel] = hdr.Typeflag
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write %q: %w", "/"+rel, err)
		}
		if body != nil && hdr.Size > 0 {
			if _, err := io.CopyN(tw, body, hdr.Size); err != nil {
				return fmt.Errorf("copy %q: %w", "/"+rel, err)
			}
		}
		return nil
	}
	// dirEntry is the entry of a directory the copy creates without
	// carrying it: the image's own (opts.Lookup), else root-owned 0755.
	dirEntry := func(rel string) (*tar.Header, error) {
		h := header(rel+"/", tar.TypeDir, 0o755, 0, 0, epoch)
		if opts.Lookup == nil {
			return h, nil
		}
		found, err := opts.Lookup("/" + rel)
		switch {
		case err != nil:
			return nil, fmt.Errorf("look up /%s in the image: %w", rel, err)
		case found == nil:
		case found.Typeflag == tar.TypeDir:
			h.Mode, h.Uid, h.Gid = found.Mode&0o7777, found.Uid, found.Gid
		case found.Typeflag == tar.TypeSymlink:
			return nil, fmt.Errorf("/%s is a symlink to %s in the image: copy to the directory it points to: %w", rel, found.Linkname, errdefs.ErrInvalidArgument)
		default:
			return nil, fmt.Errorf("/%s is a file in the image, not a directory: %w", rel, errdefs.ErrInvalidArgument)
		}
		return h, nil
	}
	// parents writes an entry (dirEntry) for every missing ancestor of rel
	// (which is not itself written).
	parents := func(rel string) error {
		var missing []string
		for d := path.Dir(rel); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := kinds[d]; ok {
				break
			}
			missing = append(missing, d)
		}
		for i := len(missing) - 1; i >= 0; i-- {
			if ex.excluded(missing[i]) {
				continue
			}
			h, err := dirEntry(missing[i])
			if err != nil {
				return err
			}
			if err := emit(h, nil); err != nil {
				return err
			}
		}
		return nil
	}
	sawEntry := false
	tr := tar.NewReader(src)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		in, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read source tar: %w", err)
		}
		if in.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		rel, err := cleanSourceName(in.Name)
		if err != nil {
			return fmt.Errorf("entry %q: %w", in.Name, err)
		}
		out := path.Join(base, rel)
		if base == "" && rel == "." {
			sawEntry = true
			continue // the container's root itself: never rewritten
		}
		if out == "" || out == "." {
			continue
		}
		if !sawEntry && rel != "." && base != "" {
			// dst itself, before its first child.
			if _, ok := kinds[base]; !ok {
				if err := parents(base); err != nil {
					return err
				}
				h, err := dirEntry(base)
				if err != nil {
					return err
				}
				if err := emit(h, nil); err != nil {
					return err
				}
			}
		}
		sawEntry = true
		if err := parents(out); err != nil {
			return err
		}
		mode := in.Mode & 0o7777
		var hdr *tar.Header
		var body io.Reader
		switch in.Typeflag {
		case tar.TypeDir:
			hdr = header(out+"/", tar.TypeDir, mode, 0, 0, epoch)
		case tar.TypeReg:
			hdr = header(out, tar.TypeReg, mode, 0, 0, epoch)
			hdr.Size, body = in.Size, tr
		case tar.TypeSymlink:
			if in.Linkname == "" || strings.IndexByte(in.Linkname, 0) >= 0 {
				return fmt.Errorf("entry %q: %w: empty or NUL symlink target", in.Name, ErrUnsafeEntry)
			}
			hdr = header(out, tar.TypeSymlink, mode, 0, 0, epoch)
			hdr.Linkname = in.Linkname
		case tar.TypeLink:
			t, err := cleanSourceName(in.Linkname)
			if err != nil {
				return fmt.Errorf("entry %q: hard link target %q: %w", in.Name, in.Linkname, err)
			}
			target := path.Join(base, t)
			if kinds[target] != tar.TypeReg || t == "." {
				return fmt.Errorf("entry %q: %w: hard link to %q, which is not a file earlier in the tar", in.Name, ErrUnsafeEntry, in.Linkname)
			}
			hdr = header(out, tar.TypeLink, mode, 0, 0, epoch)
			hdr.Linkname = target
		default:
			return fmt.Errorf("entry %q: %w: type %q cannot be copied", in.Name, ErrUnsafeEntry, string(in.Typeflag))
		}
		if err := emit(hdr, body); err != nil {
			return fmt.Errorf("entry %q: %w", in.Name, err)
		}
	}
	if !sawEntry && base != "" {
		// An empty source still makes dst.
		if err := parents(base); err != nil {
			return err
		}
		if err := emit(header(base+"/", tar.TypeDir, 0o755, 0, 0, epoch), nil); err != nil {
			return err
		}
	}
	return tw.Close()
}

// cleanSourceName turns a source entry name into a clean relative path
// ("." for the source itself) or refuses it.
func cleanSourceName(name string) (string, error) {
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("%w: empty name or NUL byte", ErrUnsafeEntry)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: absolute name", ErrUnsafeEntry)
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return "", fmt.Errorf("%w: \"..\" in name", ErrUnsafeEntry)
		}
		if strings.HasPrefix(p, whiteoutPrefix) {
			return "", fmt.Errorf("%w: %q is reserved for whiteouts", ErrUnsafeEntry, p)
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return ".", nil
	}
	return strings.Join(parts, "/"), nil
}
