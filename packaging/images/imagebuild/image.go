package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/levers9/levers9/dashboard/web"
)

// Names are the images Build makes, in the order `make images` builds them.
var Names = []string{"controlplane", "worker", "runner", "dashboard-api", "dashboard-web"}

// NonRootUID is the controlplane image's user and group (levers9).
const NonRootUID = 65532

// The paths binaries have in the images. The controlplane serves agent
// downloads from its executable's directory (controlplane/agentdist), so
// the agents sit beside it.
const (
	ControlplanePath = "/usr/local/bin/levers9-controlplane"
	AgentPath        = "/usr/local/bin/levers9-agent"
	RunscPath        = "/usr/local/lib/levers9/runsc"
	// WeedPath is SeaweedFS's weed in the worker image, which the agent
	// mounts seaweedfs volumes with; the image's WeedEnv points the agent
	// at it (its --weed default).
	WeedPath = "/usr/local/lib/levers9/weed"
	WeedEnv  = "LEVERS9_WEED_BIN"
)

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Options are the inputs of every image.
type Options struct {
	// DistDir holds the release binaries: levers9-controlplane-linux-ARCH
	// and levers9-agent-linux-ARCH.
	DistDir string
	// CacheDir is the levers9 cache root; root filesystems live in
	// CacheDir/rootfs.
	CacheDir string
	// Runsc is the pinned gVisor runsc the worker image carries.
	Runsc string
	// Weed is the pinned SeaweedFS weed the worker image carries
	// (EnsureWeed).
	Weed string
	// ControlplanePlatforms are the architectures of the controlplane
	// image's index (default amd64 and arm64: it needs no root filesystem,
	// only binaries). The worker and runner are amd64 only: an arm64
	// mmdebstrap needs qemu-user emulation.
	ControlplanePlatforms []string
	// Source, Revision and Version fill the OCI labels.
	Source, Revision, Version string
	// Created is the images' creation time and the mtime of the files
	// levers9 adds (the commit time, so a rebuild gives the same digest).
	Created time.Time
	// Web is the standalone build of dashboard/web the dashboard-web image
	// carries (its APIBase is fixed in it and recorded in APIBaseLabel).
	Web *web.Build
	// Epoch is SOURCE_DATE_EPOCH for mmdebstrap.
	Epoch int64
	// Log receives progress lines.
	Log io.Writer
}

// Image is one built image: a single-platform Image, or an Index for the
// multi-platform controlplane.
type Image struct {
	Name  string // levers9-controlplane
	Image v1.Image
	Index v1.ImageIndex
	// Packages is the package list (dist/images/NAME.packages.txt), whose
	// sha256 is PackagesSHA and the PackagesLabel of every config.
	Packages    []byte
	PackagesSHA string
}

// Digest is the manifest (or index) digest.
func (i *Image) Digest() (v1.Hash, error) {
	if i.Index != nil {
		return i.Index.Digest()
	}
	return i.Image.Digest()
}

// WriteOutputs writes NAME.packages.txt and NAME.digest into dir.
func (i *Image) WriteOutputs(dir string) error {
	d, err := i.Digest()
	if err != nil {
		return fmt.Errorf("digest of %s: %w", i.Name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, i.Name+".packages.txt"), i.Packages, 0o644); err != nil {
		return fmt.Errorf("package list of %s: %w", i.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, i.Name+".digest"), []byte(d.String()+"\n"), 0o644); err != nil {
		return fmt.Errorf("digest of %s: %w", i.Name, err)
	}
	return nil
}

// RootfsFor is the root filesystems the image name needs (the controlplane
// and the dashboard API take their CA bundle from the runner's).
func RootfsFor(name string, epoch int64) ([]Rootfs, error) {
	switch name {
	case "controlplane", "runner", "dashboard-api":
		return []Rootfs{RunnerRootfs(epoch)}, nil
	case "worker":
		return []Rootfs{WorkerRootfs(epoch)}, nil
	case "dashboard-web":
		return []Rootfs{DashboardWebRootfs(epoch)}, nil
	}
	return nil, fmt.Errorf("unknown image %q (have %v)", name, Names)
}

// Build makes the image name (one of Names), building and caching the root
// filesystem it needs first.
func Build(ctx context.Context, name string, o Options) (*Image, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if len(o.ControlplanePlatforms) == 0 {
		o.ControlplanePlatforms = []string{"amd64", "arm64"}
	}
	fs, err := RootfsFor(name, o.Epoch)
	if err != nil {
		return nil, err
	}
	tarPath, err := EnsureRootfs(ctx, o.CacheDir, fs[0], o.Log)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Log, "images: building levers9-%s\n", name)
	switch name {
	case "controlplane":
		return buildControlplane(o, tarPath)
	case "worker":
		return buildWorker(o, tarPath)
	case "dashboard-api":
		return buildDashboardAPI(o, tarPath)
	case "dashboard-web":
		return buildDashboardWeb(o, tarPath)
	default:
		return buildRunner(o, tarPath)
	}
}

func (o Options) binary(name, arch string) string {
	return filepath.Join(o.DistDir, fmt.Sprintf("%s-linux-%s", name, arch))
}

func (o Options) labels(name, packagesSHA string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    name,
		"org.opencontainers.image.source":   o.Source,
		"org.opencontainers.image.revision": o.Revision,
		"org.opencontainers.image.version":  o.Version,
		"org.opencontainers.image.created":  o.Created.UTC().Format(time.RFC3339),
		PackagesLabel:                       packagesSHA,
	}
}

// layer is a layer and the history line that says what made it.
type layer struct {
	l  v1.Layer
	by string
}

func (o Options) image(arch string, cfg v1.Config, layers ...layer) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf := &v1.ConfigFile{Architecture: arch, OS: "linux", Created: v1.Time{Time: o.Created.UTC()}, Config: cfg,
		RootFS: v1.RootFS{Type: "layers"}}
	if arch == "arm64" {
		cf.Variant = "v8"
	}
	img, err := mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		img, err = mutate.Append(img, mutate.Addendum{Layer: l.l, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: o.Created.UTC()}, CreatedBy: l.by}})
		if err != nil {
			return nil, err
		}
	}
	return img, nil
}

// buildControlplane makes a multi-platform index: the static controlplane
// for each platform, the agents it hands to machines beside it, the CA
// bundle from the runner's root filesystem, a passwd and group naming the
// non-root user, and /tmp, the only place it may write (its root is meant
// to be read-only).
func buildControlplane(o Options, runnerTar string) (*Image, error) {
	const name = "levers9-controlplane"
	baseLayer, lines, err := nonRootBase(o, runnerTar)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	agentArchs := []string{"amd64", "arm64"}
	var agents []file
	for _, arch := range agentArchs {
		bin := o.binary("levers9-agent", arch)
		mods, err := goModules(filepath.Base(bin), bin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		lines = append(lines, mods...)
		agents = append(agents, file{Path: "/usr/local/bin/" + filepath.Base(bin), Mode: 0o755, Source: bin})
	}
	for _, arch := range o.ControlplanePlatforms {
		bin := o.binary("levers9-controlplane", arch)
		mods, err := goModules(filepath.Base(bin), bin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		lines = append(lines, mods...)
	}
	pkgs, sum := packageList(lines)

	uid := fmt.Sprint(NonRootUID)
	agentLayer, err := filesLayer(agents, o.Created)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	cfg := v1.Config{
		User:       uid + ":" + uid,
		Entrypoint: []string{ControlplanePath},
		Env:        []string{defaultPath, "HOME=/tmp", "TMPDIR=/tmp"},
		WorkingDir: "/tmp",
		Labels:     o.labels(name, sum),
		ExposedPorts: map[string]struct{}{
			"1993/tcp": {}, "1994/tcp": {}, "1995/tcp": {}, "1995/udp": {},
		},
	}
	idx, err := o.staticIndex(name, "levers9-controlplane", ControlplanePath, cfg,
		layer{baseLayer, "levers9 images: passwd, group, CA bundle, /tmp"},
		layer{agentLayer, "levers9 images: agent binaries for download"})
	if err != nil {
		return nil, err
	}
	return &Image{Name: name, Index: idx, Packages: pkgs, PackagesSHA: sum}, nil
}

// buildWorker makes the amd64 worker: the Debian root filesystem with
// runc, iptables and fuse3 (fusermount3), the agent, the pinned runsc and
// the pinned weed (volume mounts). It runs as root: worker pods are
// privileged, and the agent drives runc, iptables and FUSE.
func buildWorker(o Options, workerTar string) (*Image, error) {
	const name, arch = "levers9-worker", "amd64"
	if o.Runsc == "" {
		return nil, errors.New(name + ": no runsc given (packaging/dev/runsc.sh builds the pinned one)")
	}
	if o.Weed == "" {
		return nil, errors.New(name + ": no weed given (packaging/seaweedfs/build.sh builds the pinned one)")
	}
	status, err := readTarFile(workerTar, "var/lib/dpkg/status")
	if err != nil {
		return nil, fmt.Errorf("%s: dpkg status: %w", name, err)
	}
	lines := dpkgPackages(status)
	agent := o.binary("levers9-agent", arch)
	for _, b := range []struct{ name, path string }{{"levers9-agent", agent}, {"runsc", o.Runsc}, {"weed", o.Weed}} {
		mods, err := goModules(b.name, b.path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		lines = append(lines, mods...)
	}
	pkgs, sum := packageList(lines)
	root, err := rootfsLayer(workerTar)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	bins, err := filesLayer(append(dirs(RunscPath, AgentPath),
		file{Path: AgentPath, Mode: 0o755, Source: agent},
		file{Path: RunscPath, Mode: 0o755, Source: o.Runsc},
		file{Path: WeedPath, Mode: 0o755, Source: o.Weed}), o.Created)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	img, err := o.image(arch, v1.Config{
		User:       "0:0",
		Entrypoint: []string{AgentPath},
		// The agent's --weed defaults to $LEVERS9_WEED_BIN: worker pods
		// mount volumes with the image's own weed, whatever their args.
		Env:        []string{defaultPath, WeedEnv + "=" + WeedPath},
		WorkingDir: "/",
		Labels:     o.labels(name, sum),
	}, layer{root, "mmdebstrap " + describe(WorkerRootfs(o.Epoch))}, layer{bins, "levers9 images: levers9-agent, runsc, weed"})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &Image{Name: name, Image: img, Packages: pkgs, PackagesSHA: sum}, nil
}

// buildRunner makes the amd64 runner: Debian with Python, root by default
// (the sandbox decides a task's user).
func buildRunner(o Options, runnerTar string) (*Image, error) {
	const name, arch = "levers9-runner", "amd64"
	status, err := readTarFile(runnerTar, "var/lib/dpkg/status")
	if err != nil {
		return nil, fmt.Errorf("%s: dpkg status: %w", name, err)
	}
	pkgs, sum := packageList(dpkgPackages(status))
	root, err := rootfsLayer(runnerTar)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	img, err := o.image(arch, v1.Config{
		User:       "0:0",
		Cmd:        []string{"/usr/bin/python3"},
		Env:        []string{defaultPath, "LANG=C.UTF-8"},
		WorkingDir: "/",
		Labels:     o.labels(name, sum),
	}, layer{root, "mmdebstrap " + describe(RunnerRootfs(o.Epoch))})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &Image{Name: name, Image: img, Packages: pkgs, PackagesSHA: sum}, nil
}

func describe(r Rootfs) string {
	pkgs := slices.Clone(r.Packages)
	slices.Sort(pkgs)
	return fmt.Sprintf("--variant=%s --architectures=%s --include=%v %s", r.Variant, r.Arch, pkgs, r.Suite)
}

// staticIndex makes an index of one image per ControlplanePlatforms
// architecture: the shared layers, then the static binary bin of that
// architecture at path.
func (o Options) staticIndex(name, bin, path string, cfg v1.Config, shared ...layer) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range o.ControlplanePlatforms {
		binLayer, err := filesLayer([]file{{Path: path, Mode: 0o755, Source: o.binary(bin, arch)}}, o.Created)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, arch, err)
		}
		layers := append(append([]layer(nil), shared...), layer{binLayer, "levers9 images: " + bin + " linux/" + arch})
		img, err := o.image(arch, cfg, layers...)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, arch, err)
		}
		p := &v1.Platform{OS: "linux", Architecture: arch}
		if arch == "arm64" {
			p.Variant = "v8"
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: p}})
	}
	return idx, nil
}
