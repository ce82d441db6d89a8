package imagebuild

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The dashboard images' paths and settings.
const (
	DashboardAPIPath = "/usr/local/bin/levers9-dashboard-api"
	// DashboardWebDir holds the web app's standalone server (server.js).
	DashboardWebDir = "/app"
	// DashboardWebPort is where the web image's server listens.
	DashboardWebPort = 3000
	// APIBaseLabel records the NEXT_PUBLIC_API_BASE a dashboard-web image
	// was built for: the browser app calls that URL, and it cannot change
	// after the build.
	APIBaseLabel = "io.levers9.dashboard.api-base"
)

// nonRootBase is the layer of the static non-root images (controlplane,
// dashboard API): passwd and group naming levers9, the CA bundle from the
// runner's root filesystem, and /tmp, the only place they may write.
func nonRootBase(o Options, runnerTar string) (v1.Layer, []string, error) {
	ca, err := readTarFile(runnerTar, "etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		return nil, nil, fmt.Errorf("CA bundle: %w", err)
	}
	status, err := readTarFile(runnerTar, "var/lib/dpkg/status")
	if err != nil {
		return nil, nil, fmt.Errorf("dpkg status: %w", err)
	}
	uid := fmt.Sprint(NonRootUID)
	base := append(dirs("/etc/ssl/certs/x", "/usr/local/bin/x"),
		file{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/usr/sbin/nologin\nlevers9:x:" + uid + ":" + uid + ":levers9:/tmp:/usr/sbin/nologin\n")},
		file{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nlevers9:x:" + uid + ":\n")},
		file{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Data: ca},
		file{Path: "/tmp", Mode: 0o1777, Dir: true},
	)
	l, err := filesLayer(base, o.Created)
	if err != nil {
		return nil, nil, err
	}
	return l, dpkgPackages(status, "ca-certificates"), nil
}

// buildDashboardAPI makes the dashboard API's index, one image per
// ControlplanePlatforms architecture: the static binary, non-root, with the
// CA bundle for a controlplane behind TLS. Like the controlplane it is made
// for a read-only root with an emptyDir on /tmp.
func buildDashboardAPI(o Options, runnerTar string) (*Image, error) {
	const name = "levers9-dashboard-api"
	baseLayer, lines, err := nonRootBase(o, runnerTar)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	for _, arch := range o.ControlplanePlatforms {
		bin := o.binary(name, arch)
		mods, err := goModules(filepath.Base(bin), bin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		lines = append(lines, mods...)
	}
	pkgs, sum := packageList(lines)
	uid := fmt.Sprint(NonRootUID)
	cfg := v1.Config{
		User:       uid + ":" + uid,
		Entrypoint: []string{DashboardAPIPath},
		// The default listen address is loopback, useless in a container.
		Env:          []string{defaultPath, "HOME=/tmp", "TMPDIR=/tmp", "LEVERS9_DASHBOARD_ADDR=:1997"},
		WorkingDir:   "/tmp",
		Labels:       o.labels(name, sum),
		ExposedPorts: map[string]struct{}{"1997/tcp": {}},
	}
	idx, err := o.staticIndex(name, name, DashboardAPIPath, cfg, layer{baseLayer, "levers9 images: passwd, group, CA bundle, /tmp"})
	if err != nil {
		return nil, err
	}
	return &Image{Name: name, Index: idx, Packages: pkgs, PackagesSHA: sum}, nil
}

// buildDashboardWeb makes the amd64 web image: Debian trixie's Node.js, and
// the Next.js standalone output of o.Web (server.js, the node_modules it
// traced, the static assets) under /app, run as levers9 (65532). Next.js's
// cache directory points into /tmp, so the root can be read-only.
func buildDashboardWeb(o Options, webTar string) (*Image, error) {
	const name, arch = "levers9-dashboard-web", "amd64"
	if o.Web == nil || !o.Web.Standalone {
		return nil, fmt.Errorf("%s: no standalone build of dashboard/web given", name)
	}
	status, err := readTarFile(webTar, "var/lib/dpkg/status")
	if err != nil {
		return nil, fmt.Errorf("%s: dpkg status: %w", name, err)
	}
	passwd, err := readTarFile(webTar, "etc/passwd")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	group, err := readTarFile(webTar, "etc/group")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	dist := filepath.Join(o.Web.Dir, o.Web.DistDir)
	standalone := filepath.Join(dist, "standalone")
	if _, err := os.Stat(filepath.Join(standalone, "server.js")); err != nil {
		return nil, fmt.Errorf("%s: standalone build: %w", name, err)
	}
	var files []file
	for _, tree := range []struct{ src, dst string }{
		{standalone, DashboardWebDir},
		// Next.js leaves the static assets and public/ out of standalone:
		// they go where server.js looks for them.
		{filepath.Join(dist, "static"), path.Join(DashboardWebDir, filepath.ToSlash(o.Web.DistDir), "static")},
		{filepath.Join(o.Web.Dir, "public"), path.Join(DashboardWebDir, "public")},
	} {
		tf, err := treeFiles(tree.src, tree.dst)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		files = append(files, tf...)
	}
	lines := dpkgPackages(status)
	npm, err := npmPackages(filepath.Join(standalone, "node_modules"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	pkgs, sum := packageList(append(lines, npm...))

	uid := fmt.Sprint(NonRootUID)
	files = append(files,
		file{Path: "/etc/passwd", Mode: 0o644, Data: append(passwd, []byte("levers9:x:"+uid+":"+uid+":levers9:/tmp:/usr/sbin/nologin\n")...)},
		file{Path: "/etc/group", Mode: 0o644, Data: append(group, []byte("levers9:x:"+uid+":\n")...)},
		file{Path: path.Join(DashboardWebDir, filepath.ToSlash(o.Web.DistDir), "cache"), Link: "/tmp/next-cache"},
	)
	app, err := filesLayer(append(dirs(path.Join(DashboardWebDir, filepath.ToSlash(o.Web.DistDir), "x")), files...), o.Created)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	root, err := rootfsLayer(webTar)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	labels := o.labels(name, sum)
	labels[APIBaseLabel] = o.Web.APIBase
	img, err := o.image(arch, v1.Config{
		User:       uid + ":" + uid,
		Entrypoint: []string{"/usr/bin/node", path.Join(DashboardWebDir, "server.js")},
		Env: []string{defaultPath, "HOME=/tmp", "TMPDIR=/tmp", "NODE_ENV=production", "NEXT_TELEMETRY_DISABLED=1",
			"HOSTNAME=0.0.0.0", fmt.Sprintf("PORT=%d", DashboardWebPort), "NEXT_PUBLIC_API_BASE=" + o.Web.APIBase},
		WorkingDir:   DashboardWebDir,
		Labels:       labels,
		ExposedPorts: map[string]struct{}{fmt.Sprintf("%d/tcp", DashboardWebPort): {}},
	}, layer{root, "mmdebstrap " + describe(DashboardWebRootfs(o.Epoch))},
		layer{app, "levers9 images: dashboard/web standalone build for NEXT_PUBLIC_API_BASE=" + o.Web.APIBase})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &Image{Name: name, Image: img, Packages: pkgs, PackagesSHA: sum}, nil
}

// treeFiles lists the files, directories and symlinks under src as layer
// entries under dst: files 0644 (0755 when executable), directories 0755,
// all root's, so the non-root user can read but not change the app.
func treeFiles(src, dst string) ([]file, error) {
	if _, err := os.Stat(src); os.IsNotExist(err) {
		return nil, nil
	}
	var out []file
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out = append(out, file{Path: target, Link: link})
		case d.IsDir():
			out = append(out, file{Path: target, Mode: 0o755, Dir: true})
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			mode := int64(0o644)
			if info.Mode()&0o111 != 0 {
				mode = 0o755
			}
			out = append(out, file{Path: target, Mode: mode, Source: p})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("files of %s: %w", src, err)
	}
	return out, nil
}

// npmPackages lists the packages of a node_modules tree as "npm NAME
// VERSION" lines, nested ones included.
func npmPackages(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) && p == dir {
				return filepath.SkipDir
			}
			return err
		}
		if d.IsDir() || d.Name() != "package.json" {
			return nil
		}
		parent := filepath.Base(filepath.Dir(filepath.Dir(p)))
		scoped := filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(p))))
		if parent != "node_modules" && !(strings.HasPrefix(parent, "@") && scoped == "node_modules") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var pj struct{ Name, Version string }
		if json.Unmarshal(b, &pj) != nil || pj.Name == "" {
			return nil
		}
		out = append(out, fmt.Sprintf("npm %s %s", pj.Name, pj.Version))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("npm packages of %s: %w", dir, err)
	}
	return out, nil
}
