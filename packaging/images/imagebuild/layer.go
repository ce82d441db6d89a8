package imagebuild

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// rootfsLayer is the layer of a cached mmdebstrap tar: its entries in the
// tar's order (mmdebstrap writes them sorted by name), names relative to
// /, without device nodes or FIFOs (the runtime makes /dev), with owner
// names, access and change times dropped, so the same tar always gives
// the same layer digest.
func rootfsLayer(tarPath string) (v1.Layer, error) {
	opener := func() (io.ReadCloser, error) {
		f, err := os.Open(tarPath)
		if err != nil {
			return nil, err
		}
		pr, pw := io.Pipe()
		go func() {
			defer f.Close()
			pw.CloseWithError(normalizeTar(f, pw))
		}()
		return pr, nil
	}
	l, err := tarball.LayerFromOpener(opener, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer from %s: %w", tarPath, err)
	}
	return l, nil
}

func normalizeTar(r io.Reader, w io.Writer) error {
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read rootfs tar: %w", err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		if name == "" || h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock || h.Typeflag == tar.TypeFifo {
			continue
		}
		h.Name = name
		if h.Typeflag == tar.TypeLink {
			h.Linkname = strings.TrimPrefix(h.Linkname, "./")
		}
		h.Uname, h.Gname = "", ""
		h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}
		for k := range h.PAXRecords {
			if k == "atime" || k == "ctime" || k == "mtime" {
				delete(h.PAXRecords, k)
			}
		}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("write layer entry %s: %w", name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("write layer entry %s: %w", name, err)
		}
	}
	return tw.Close()
}

// file is one entry of a layer levers9 makes itself.
type file struct {
	Path     string // absolute in the image
	Mode     int64  // permission bits, plus c_ISVTX for sticky /tmp
	UID, GID int
	Dir      bool
	Data     []byte // content, or
	Source   string // a file on this machine to copy, or
	Link     string // a symlink's target
}

// filesLayer makes a layer of files, sorted by path, all with mtime, so the
// same files give the same digest.
func filesLayer(files []file, mtime time.Time) (v1.Layer, error) {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.Path, b.Path) })
	for _, f := range files {
		if f.Source != "" {
			if _, err := os.Stat(f.Source); err != nil {
				return nil, fmt.Errorf("layer file %s: %w", f.Path, err)
			}
		}
	}
	opener := func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeFiles(pw, files, mtime)) }()
		return pr, nil
	}
	l, err := tarball.LayerFromOpener(opener, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer of %d files: %w", len(files), err)
	}
	return l, nil
}

func writeFiles(w io.Writer, files []file, mtime time.Time) error {
	tw := tar.NewWriter(w)
	for _, f := range files {
		h := &tar.Header{Name: strings.TrimPrefix(f.Path, "/"), Mode: f.Mode, Uid: f.UID, Gid: f.GID,
			ModTime: mtime, Format: tar.FormatPAX}
		var body io.Reader
		switch {
		case f.Dir:
			h.Typeflag = tar.TypeDir
			h.Name += "/"
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Link, 0o777
		case f.Source != "":
			src, err := os.Open(f.Source)
			if err != nil {
				return fmt.Errorf("layer file %s: %w", f.Path, err)
			}
			defer src.Close()
			st, err := src.Stat()
			if err != nil {
				return fmt.Errorf("layer file %s: %w", f.Path, err)
			}
			h.Typeflag, h.Size, body = tar.TypeReg, st.Size(), src
		default:
			h.Typeflag, h.Size, body = tar.TypeReg, int64(len(f.Data)), bytes.NewReader(f.Data)
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("layer file %s: %w", f.Path, err)
		}
		if body != nil {
			if n, err := io.Copy(tw, body); err != nil || n != h.Size {
				return fmt.Errorf("layer file %s: copied %d of %d bytes: %v", f.Path, n, h.Size, err)
			}
		}
	}
	return tw.Close()
}

// dirs returns directory entries for every parent of paths (root-owned,
// 0755), so a layer never relies on the runtime inventing them.
func dirs(paths ...string) []file {
	seen := map[string]bool{}
	var out []file
	for _, p := range paths {
		for d := path.Dir(p); d != "/" && !seen[d]; d = path.Dir(d) {
			seen[d] = true
			out = append(out, file{Path: d, Mode: 0o755, Dir: true})
		}
	}
	return out
}

// readTarFile returns the content of name (relative to /) in a rootfs tar.
func readTarFile(tarPath, name string) ([]byte, error) {
	f, err := os.Open(tarPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("%s: no %s", tarPath, name)
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", tarPath, err)
		}
		if strings.TrimPrefix(h.Name, "./") != name {
			continue
		}
		if h.Typeflag == tar.TypeSymlink {
			target := h.Linkname
			if !path.IsAbs(target) {
				target = path.Join(path.Dir("/"+name), target)
			}
			return readTarFile(tarPath, strings.TrimPrefix(target, "/"))
		}
		return io.ReadAll(tr)
	}
}
