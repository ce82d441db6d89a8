// Package build owns the small image builder used by tests and the local
// stack: it makes layers from in-memory files, assembles an OCI image with
// go-containerregistry and pushes it with remote.Write. BuildBusybox makes the
// standard test and demo image from Debian's busybox-static. It must never
// read files other than those it is given (and /bin/busybox), never push to a
// registry it was not named, and never log credentials. API stability:
// experimental; used by tests, bench programs and packaging/ for the demo
// image.
package build

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultBusybox is where Debian's busybox-static installs its binary.
const DefaultBusybox = "/bin/busybox"

// epoch is the mtime of every entry, so equal inputs give equal digests.
var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Applets are linked to /bin/busybox in BuildBusybox's image.
var Applets = []string{
	"[", "ash", "awk", "base64", "basename", "cat", "chgrp", "chmod", "chown", "chroot", "cmp", "cp",
	"cut", "date", "dd", "df", "diff", "dirname", "dmesg", "du", "echo", "env", "expr", "false",
	"find", "free", "grep", "gzip", "head", "hexdump", "hostname", "id", "ifconfig", "insmod", "ip",
	"kill", "killall", "ln", "ls", "lsmod", "md5sum", "mkdir", "mkfifo", "mknod", "mktemp",
	"modprobe", "mount", "mv", "nc", "nproc", "nsenter", "od", "pidof", "ping", "ping6", "printf",
	"ps", "pwd", "readlink", "realpath", "rm", "rmdir", "sed", "seq", "setpriv", "sh", "sha256sum",
	"sleep", "sort", "stat", "su", "sync", "sysctl", "tail", "tar", "tee", "test", "timeout", "top",
	"touch", "tr", "true", "umount", "uname", "uniq", "unshare", "usleep", "vi", "wc", "wget",
	"which", "whoami", "xargs", "yes", "zcat",
}

// File is one entry of a layer. Mode holds the permission bits (and
// setuid/setgid/sticky); Type selects what the entry is (default: a regular
// file with Data).
type File struct {
	Path     string
	Mode     int64
	Uid, Gid int
	Data     []byte
	Type     byte   // tar.TypeReg (default), tar.TypeDir, tar.TypeSymlink, tar.TypeLink
	Linkname string // target of a symlink or hardlink
}

// Config is the image config BuildBusybox and Push write.
type Config struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	WorkingDir string
	Labels     map[string]string
}

// Options for pushing. The zero value pushes anonymously over the transport
// go-containerregistry picks (plain HTTP only for loopback registries).
type Options struct {
	// Insecure allows plain HTTP to a non-loopback registry.
	Insecure bool
	// Username and Password authenticate to the registry (never logged).
	Username, Password string
	Transport          http.RoundTripper
	// Busybox is the busybox binary to package (default /bin/busybox).
	Busybox string
	Config  Config
}

// Result names what was pushed.
type Result struct {
	// Ref is registry/repo:tag; Digest the manifest digest; DigestRef
	// registry/repo@digest.
	Ref, Digest, DigestRef string
}

// TarLayer returns an uncompressed tar of files in the order given, with a
// fixed mtime so equal inputs give equal digests.
func TarLayer(files []File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, f := range files {
		hdr := &tar.Header{
			Name: f.Path, Mode: f.Mode, Uid: f.Uid, Gid: f.Gid, ModTime: epoch,
			Typeflag: f.Type, Linkname: f.Linkname, Format: tar.FormatPAX,
		}
		switch f.Type {
		case 0, tar.TypeReg:
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(f.Data))
		case tar.TypeDir:
			if !strings.HasSuffix(hdr.Name, "/") {
				hdr.Name += "/"
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("layer entry %d %q: %w", i, f.Path, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, fmt.Errorf("layer entry %d %q: %w", i, f.Path, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BusyboxFiles returns the entries of a minimal root filesystem around the
// busybox binary at busyboxPath: directories, /etc/passwd and /etc/group
// (root and nobody), /bin/busybox and a relative symlink per applet.
func BusyboxFiles(busyboxPath string) ([]File, error) {
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, fmt.Errorf("read busybox: %w (install busybox-static)", err)
	}
	files := []File{
		{Path: "bin", Type: tar.TypeDir, Mode: 0o755},
		{Path: "dev", Type: tar.TypeDir, Mode: 0o755},
		{Path: "etc", Type: tar.TypeDir, Mode: 0o755},
		{Path: "home", Type: tar.TypeDir, Mode: 0o755},
		{Path: "proc", Type: tar.TypeDir, Mode: 0o555},
		{Path: "root", Type: tar.TypeDir, Mode: 0o700},
		{Path: "sys", Type: tar.TypeDir, Mode: 0o555},
		{Path: "tmp", Type: tar.TypeDir, Mode: 0o1777},
		{Path: "usr", Type: tar.TypeDir, Mode: 0o755},
		{Path: "usr/bin", Type: tar.TypeDir, Mode: 0o755},
		{Path: "var", Type: tar.TypeDir, Mode: 0o755},
		{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/sh\n")},
		{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\n")},
		{Path: "bin/busybox", Mode: 0o755, Data: bin},
	}
	applets := append([]string(nil), Applets...)
	sort.Strings(applets)
	for _, a := range applets {
		files = append(files, File{Path: path.Join("bin", a), Type: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777})
	}
	return files, nil
}

// BuildBusybox builds an image of busybox-static plus extraFiles (a second
// layer, e.g. a static probe binary at /usr/bin/probe) and pushes it to
// registry/repo:tag. The default command is /bin/sh.
func BuildBusybox(ctx context.Context, registry, repo, tag string, extraFiles []File, opts Options) (Result, error) {
	bb := opts.Busybox
	if bb == "" {
		bb = DefaultBusybox
	}
	base, err := BusyboxFiles(bb)
	if err != nil {
		return Result{}, err
	}
	baseTar, err := TarLayer(base)
	if err != nil {
		return Result{}, fmt.Errorf("busybox layer: %w", err)
	}
	layers := [][]byte{baseTar}
	if len(extraFiles) > 0 {
		extra, err := TarLayer(extraFiles)
		if err != nil {
			return Result{}, fmt.Errorf("extra layer: %w", err)
		}
		layers = append(layers, extra)
	}
	if opts.Config.Cmd == nil && opts.Config.Entrypoint == nil {
		opts.Config.Cmd = []string{"/bin/sh"}
	}
	if opts.Config.Env == nil {
		opts.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	}
	return Push(ctx, registry, repo, tag, layers, opts)
}

// Push assembles an image from uncompressed tar layers (bottom first; each is
// gzipped) and opts.Config, and pushes it to registry/repo:tag. Layers are
// pushed as given: Push never checks them, so tests can push hostile ones.
func Push(ctx context.Context, registry, repo, tag string, layers [][]byte, opts Options) (Result, error) {
	var nopts []name.Option
	if opts.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	ref, err := name.NewTag(registry+"/"+repo+":"+tag, nopts...)
	if err != nil {
		return Result{}, fmt.Errorf("image reference %s/%s:%s: %w", registry, repo, tag, err)
	}
	img := empty.Image
	for i, l := range layers {
		// Cache the gzip output: otherwise it is compressed once for the
		// digest and again for the upload.
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(l)), nil
		}, tarball.WithCompressedCaching)
		if err != nil {
			return Result{}, fmt.Errorf("layer %d: %w", i, err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return Result{}, fmt.Errorf("layer %d: %w", i, err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Result{}, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", runtime.GOARCH, v1.Time{Time: epoch}
	c := opts.Config
	cf.Config = v1.Config{Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, User: c.User, WorkingDir: c.WorkingDir, Labels: c.Labels}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return Result{}, err
	}
	ropts := []remote.Option{remote.WithContext(ctx)}
	if opts.Username != "" || opts.Password != "" {
		ropts = append(ropts, remote.WithAuth(&authn.Basic{Username: opts.Username, Password: opts.Password}))
	}
	if opts.Transport != nil {
		ropts = append(ropts, remote.WithTransport(opts.Transport))
	}
	if err := remote.Write(ref, img, ropts...); err != nil {
		return Result{}, fmt.Errorf("push %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return Result{}, err
	}
	return Result{Ref: ref.Name(), Digest: d.String(), DigestRef: ref.Context().Digest(d.String()).Name()}, nil
}
