package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/levers9/levers9/dashboard/web"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
)

const repoRoot = "../../.."

// testRevision stands in for a commit: the run tag's name and the
// revision label.
const testRevision = "0123456789abcdef0123456789abcdef01234567"

// distDir is where distBinaries builds; TestMain removes it.
var distDir = filepath.Join(os.TempDir(), fmt.Sprintf("l9img-dist-%d", os.Getpid()))

// distBinaries builds, once per test binary, the flat dist/ layout `make
// release` writes (controlplane and agent for amd64 and arm64, static).
var distBinaries = sync.OnceValues(func() (string, error) {
	dir := distDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, arch := range []string{"amd64", "arm64"} {
		for _, bin := range []string{"levers9-controlplane", "levers9-agent", "levers9-dashboard-api"} {
			out := filepath.Join(dir, fmt.Sprintf("%s-linux-%s", bin, arch))
			cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./cmd/"+bin)
			cmd.Dir = repoRoot
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
			if b, err := cmd.CombinedOutput(); err != nil {
				return "", fmt.Errorf("go build %s: %v\n%s", out, err, b)
			}
		}
	}
	return dir, nil
})

// testAPIBase is the NEXT_PUBLIC_API_BASE the dashboard-web image is
// built for in the tests.
const testAPIBase = "https://levers9-api.example.com"

// webBuild makes the standalone web build once per test binary (a minute
// cold, cached across runs under dashboard/web/.next-build).
var webBuild = sync.OnceValues(func() (*web.Build, error) {
	return BuildWeb(context.Background(), repoRoot, testAPIBase, io.Discard)
})

func TestMain(m *testing.M) {
	code := m.Run()
	os.RemoveAll(distDir)
	os.Exit(code)
}

// bundle is what the image tests need: build options over real binaries,
// the cached root filesystems, the pinned runsc, and a registry.
type bundle struct {
	opts     Options
	registry string // 127.0.0.1:PORT/levers9
}

func setup(t *testing.T) bundle {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "docker-registry", "git")
	ctx := context.Background()
	cache, err := CacheRoot()
	if err != nil {
		t.Fatal(err)
	}
	log := testenv.LogWriter(t, "LEVERS9_TEST_VERBOSE")
	for _, r := range []Rootfs{RunnerRootfs(0), WorkerRootfs(0), DashboardWebRootfs(0)} {
		// A cold cache costs minutes (make test prebuilds it with
		// --rootfs-only); mmdebstrap that cannot run is a missing
		// prerequisite, fatal under CI.
		if _, err := EnsureRootfs(ctx, cache, r, log); err != nil {
			testenv.Missing(t, "mmdebstrap root filesystem: %v", err)
		}
	}
	runsc, err := EnsureRunsc(ctx, repoRoot, cache, log)
	if err != nil {
		testenv.Missing(t, "pinned runsc: %v", err)
	}
	// Built through the same script and cache as the SeaweedFS tests'
	// weed: instant when they ran, one cold build otherwise.
	weed, err := EnsureWeed(ctx, repoRoot, log)
	if err != nil {
		testenv.Missing(t, "pinned weed: %v", err)
	}
	dist, err := distBinaries()
	if err != nil {
		t.Fatal(err)
	}
	reg, err := devstack.StartRegistry(ctx, t.TempDir(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop() })
	return bundle{
		opts: Options{DistDir: dist, CacheDir: cache, Runsc: runsc, Weed: weed, Source: DefaultSource, Revision: testRevision,
			Version: "v0.0.0-test", Created: time.Unix(1764000000, 0).UTC(), Log: log},
		registry: reg.Addr() + "/levers9",
	}
}

// layerPaths lists the entries of an image's flattened filesystem (tar
// type and permission bits), with the content of the few files asked for.
func layerPaths(t *testing.T, img v1.Image, read ...string) (map[string]byte, map[string]os.FileMode, map[string][]byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	paths, modes, contents := map[string]byte{}, map[string]os.FileMode{}, map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return paths, modes, contents
		}
		if err != nil {
			t.Fatal(err)
		}
		p := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		paths[p] = h.Typeflag
		modes[p] = os.FileMode(h.Mode).Perm()
		for _, r := range read {
			if r == p {
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				contents[p] = b
			}
		}
	}
}

// TestImages builds each image twice (same digest), pushes it to a real
// registry, pulls it back and checks its config, labels, package list
// and the files it must carry.
func TestImages(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	tests := []struct {
		name       string
		archs      []string
		user       string
		entrypoint []string
		files      map[string]byte // path -> tar type (0: any)
		executable []string        // regular files that must be executable
		env        []string        // entries the config's Env must hold
		check      func(t *testing.T, arch string, contents map[string][]byte)
		labels     map[string]string
		needsWeb   bool
	}{
		{
			name: "controlplane", archs: []string{"amd64", "arm64"}, user: "65532:65532",
			entrypoint: []string{ControlplanePath},
			files: map[string]byte{
				ControlplanePath: tar.TypeReg, "/usr/local/bin/levers9-agent-linux-amd64": tar.TypeReg,
				"/usr/local/bin/levers9-agent-linux-arm64": tar.TypeReg, "/etc/ssl/certs/ca-certificates.crt": tar.TypeReg,
				"/etc/passwd": tar.TypeReg, "/etc/group": tar.TypeReg, "/tmp": tar.TypeDir,
			},
			check: func(t *testing.T, arch string, c map[string][]byte) {
				// arm64 binaries are checked by their ELF headers, not run.
				for p, want := range map[string]string{
					ControlplanePath: arch, "/usr/local/bin/levers9-agent-linux-amd64": "amd64",
					"/usr/local/bin/levers9-agent-linux-arm64": "arm64",
				} {
					if got := elfArch(t, c[p]); got != want {
						t.Errorf("%s image: %s is built for %s, want %s", arch, p, got, want)
					}
				}
				if !bytes.Contains(c["/etc/passwd"], []byte("levers9:x:65532:65532:")) {
					t.Errorf("/etc/passwd has no levers9 user:\n%s", c["/etc/passwd"])
				}
				if !bytes.Contains(c["/etc/ssl/certs/ca-certificates.crt"], []byte("BEGIN CERTIFICATE")) {
					t.Error("CA bundle has no certificates")
				}
			},
		},
		{
			name: "worker", archs: []string{"amd64"}, user: "0:0", entrypoint: []string{AgentPath},
			files: map[string]byte{
				AgentPath: tar.TypeReg, RunscPath: tar.TypeReg, "/usr/sbin/runc": tar.TypeReg,
				"/usr/sbin/iptables": 0, "/usr/sbin/iptables-restore": 0, "/usr/sbin/iptables-save": 0,
				"/usr/bin/fusermount3": tar.TypeReg, "/usr/bin/ip": 0, "/usr/bin/sh": 0, WeedPath: tar.TypeReg,
			},
			// Volumes: the agent mounts with weed, which needs fusermount3.
			executable: []string{AgentPath, RunscPath, WeedPath, "/usr/bin/fusermount3"},
			env:        []string{WeedEnv + "=" + WeedPath},
		},
		{
			name: "runner", archs: []string{"amd64"}, user: "0:0",
			files: map[string]byte{"/usr/bin/python3": 0, "/etc/ssl/certs/ca-certificates.crt": 0},
		},
		{
			name: "dashboard-api", archs: []string{"amd64", "arm64"}, user: "65532:65532",
			entrypoint: []string{DashboardAPIPath},
			files: map[string]byte{
				DashboardAPIPath: tar.TypeReg, "/etc/ssl/certs/ca-certificates.crt": tar.TypeReg,
				"/etc/passwd": tar.TypeReg, "/etc/group": tar.TypeReg, "/tmp": tar.TypeDir,
			},
			check: func(t *testing.T, arch string, c map[string][]byte) {
				if got := elfArch(t, c[DashboardAPIPath]); got != arch {
					t.Errorf("%s image: the dashboard API is built for %s", arch, got)
				}
				if !bytes.Contains(c["/etc/passwd"], []byte("levers9:x:65532:65532:")) {
					t.Errorf("/etc/passwd has no levers9 user:\n%s", c["/etc/passwd"])
				}
				if !bytes.Contains(c["/etc/ssl/certs/ca-certificates.crt"], []byte("BEGIN CERTIFICATE")) {
					t.Error("CA bundle has no certificates")
				}
			},
		},
		{
			name: "dashboard-web", archs: []string{"amd64"}, user: "65532:65532", needsWeb: true,
			entrypoint: []string{"/usr/bin/node", "/app/server.js"},
			labels:     map[string]string{APIBaseLabel: testAPIBase},
			files: map[string]byte{
				"/usr/bin/node": 0, "/app/server.js": tar.TypeReg, "/app/node_modules/next/package.json": tar.TypeReg,
				"/etc/ssl/certs/ca-certificates.crt": 0, "/etc/passwd": tar.TypeReg,
			},
			check: func(t *testing.T, arch string, c map[string][]byte) {
				if !bytes.Contains(c["/etc/passwd"], []byte("levers9:x:65532:65532:")) {
					t.Errorf("/etc/passwd has no levers9 user:\n%s", c["/etc/passwd"])
				}
				// server.js carries the build's config: the API base is
				// in it, so the image serves what the label says.
				if !bytes.Contains(c["/app/server.js"], []byte("distDir")) {
					t.Errorf("/app/server.js is not Next.js's standalone server:\n%.400s", c["/app/server.js"])
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := b.opts
			if tc.needsWeb {
				w, err := webBuild()
				if err != nil {
					testenv.Missing(t, "standalone build of dashboard/web (needs node 20.9+ and npm): %v", err)
				}
				opts.Web = w
			}
			first, err := Build(ctx, tc.name, opts)
			if err != nil {
				t.Fatal(err)
			}
			second, err := Build(ctx, tc.name, opts)
			if err != nil {
				t.Fatal(err)
			}
			d1, err := first.Digest()
			if err != nil {
				t.Fatal(err)
			}
			if d2, err := second.Digest(); err != nil || d1 != d2 {
				t.Fatalf("two builds of the same inputs: %s and %s (%v)", d1, d2, err)
			}
			out := t.TempDir()
			if err := first.WriteOutputs(out); err != nil {
				t.Fatal(err)
			}
			pkgs, err := os.ReadFile(filepath.Join(out, first.Name+".packages.txt"))
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(pkgs)
			checkPackageList(t, tc.name, string(pkgs))
			if d, err := os.ReadFile(filepath.Join(out, first.Name+".digest")); err != nil || strings.TrimSpace(string(d)) != d1.String() {
				t.Errorf("digest file %q, want %s (%v)", d, d1, err)
			}

			p, err := Push(ctx, first, PushOptions{Registry: b.registry, Tag: "latest", Revision: testRevision, Now: time.Now()})
			if err != nil {
				t.Fatal(err)
			}
			for _, tag := range []string{"latest", p.RunTag} {
				ref, err := name.ParseReference(p.Repository+":"+tag, name.Insecure)
				if err != nil {
					t.Fatal(err)
				}
				desc, err := remote.Get(ref, remote.WithContext(ctx))
				if err != nil {
					t.Fatalf("pull %s: %v", ref, err)
				}
				if desc.Digest != d1 {
					t.Errorf("%s is %s, built %s", ref, desc.Digest, d1)
				}
			}
			ref, _ := name.ParseReference(p.Repository+":latest", name.Insecure)
			pulled := pullPlatforms(t, ref, tc.archs)
			for arch, img := range pulled {
				cf, err := img.ConfigFile()
				if err != nil {
					t.Fatal(err)
				}
				c := cf.Config
				if cf.Architecture != arch || cf.OS != "linux" {
					t.Errorf("%s: config says %s/%s", arch, cf.OS, cf.Architecture)
				}
				if c.User != tc.user {
					t.Errorf("%s: user %q, want %q", arch, c.User, tc.user)
				}
				if strings.Join(c.Entrypoint, " ") != strings.Join(tc.entrypoint, " ") {
					t.Errorf("%s: entrypoint %q, want %q", arch, c.Entrypoint, tc.entrypoint)
				}
				want := map[string]string{
					"org.opencontainers.image.source":   DefaultSource,
					"org.opencontainers.image.revision": testRevision,
					"org.opencontainers.image.version":  "v0.0.0-test",
					PackagesLabel:                       hex.EncodeToString(sum[:]),
				}
				for k, v := range tc.labels {
					want[k] = v
				}
				for k, v := range want {
					if c.Labels[k] != v {
						t.Errorf("%s: label %s = %q, want %q", arch, k, c.Labels[k], v)
					}
				}
				if !cf.Created.Time.Equal(b.opts.Created) {
					t.Errorf("%s: created %s, want %s", arch, cf.Created.Time, b.opts.Created)
				}
				for _, e := range tc.env {
					if !slices.Contains(c.Env, e) {
						t.Errorf("%s: Env %q lacks %q", arch, c.Env, e)
					}
				}
				// Only checks read contents: the worker's binaries are
				// hundreds of MB.
				var read []string
				if tc.check != nil {
					for f := range tc.files {
						read = append(read, f)
					}
				}
				paths, modes, contents := layerPaths(t, img, read...)
				for f, typ := range tc.files {
					got, ok := paths[f]
					if !ok || (typ != 0 && got != typ) {
						t.Errorf("%s: %s missing or of tar type %q (want %q)", arch, f, got, typ)
					}
				}
				for _, f := range tc.executable {
					if paths[f] != tar.TypeReg || modes[f]&0o111 != 0o111 {
						t.Errorf("%s: %s is not an executable file (tar type %q, mode %v)", arch, f, paths[f], modes[f])
					}
				}
				for p, typ := range paths {
					if typ == tar.TypeChar || typ == tar.TypeBlock {
						t.Errorf("%s: device node %s in the image", arch, p)
					}
				}
				if tc.check != nil {
					tc.check(t, arch, contents)
				}
			}
		})
	}
}

// elfArch is the GOARCH an ELF binary is built for.
func elfArch(t *testing.T, b []byte) string {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Errorf("not an ELF binary: %v", err)
		return ""
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64"
	case elf.EM_AARCH64:
		return "arm64"
	}
	return f.Machine.String()
}

// checkPackageList wants Debian packages with versions, and for images
// with levers9 binaries their Go modules.
func checkPackageList(t *testing.T, image, list string) {
	t.Helper()
	want := map[string][]string{
		"controlplane": {"deb ca-certificates ", "go levers9-controlplane-linux-amd64 github.com/levers9/levers9 ",
			"go levers9-agent-linux-arm64 github.com/levers9/levers9 ", "go levers9-controlplane-linux-amd64 github.com/jackc/pgx/v5 ", "go levers9-controlplane-linux-arm64 stdlib go1."},
		"worker": {"deb runc ", "deb iptables ", "deb fuse3 ", "go levers9-agent github.com/levers9/levers9 ", "go runsc gvisor.dev/gvisor ",
			"go weed github.com/seaweedfs/seaweedfs "},
		"runner": {"deb python3 ", "deb ca-certificates "},
		"dashboard-api": {"deb ca-certificates ", "go levers9-dashboard-api-linux-amd64 github.com/levers9/levers9 ",
			"go levers9-dashboard-api-linux-arm64 stdlib go1."},
		// trixie's Node.js is 20: Next.js 16 needs 20.9 or later.
		"dashboard-web": {"deb nodejs 20.", "deb ca-certificates ", "npm next ", "npm react "},
	}[image]
	for _, w := range want {
		if !strings.Contains(list, "\n"+w) && !strings.HasPrefix(list, w) {
			t.Errorf("package list of %s has no line starting %q", image, w)
		}
	}
}

// pullPlatforms pulls ref and returns its image per architecture, wanting
// exactly archs (an index for several, a single manifest for one).
func pullPlatforms(t *testing.T, ref name.Reference, archs []string) map[string]v1.Image {
	t.Helper()
	out := map[string]v1.Image{}
	if len(archs) == 1 {
		img, err := remote.Image(ref)
		if err != nil {
			t.Fatal(err)
		}
		out[archs[0]] = img
		return out
	}
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range m.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		out[d.Platform.Architecture] = img
	}
	if len(out) != len(archs) {
		t.Fatalf("index has platforms %v, want %v", keys(out), archs)
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestRunTagNeverReused pushes one image three times, twice in the same
// second: every push gets a run tag of its own, and the earlier run tags
// still name what they named.
func TestRunTagNeverReused(t *testing.T) {
	testenv.RequireBinary(t, "docker-registry")
	ctx := context.Background()
	reg, err := devstack.StartRegistry(ctx, t.TempDir(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop() })
	now := time.Date(2026, 12, 3, 21, 0, 0, 0, time.UTC)
	seen := map[string]bool{}
	for i, at := range []time.Time{now, now, now.Add(time.Second)} {
		l, err := filesLayer([]file{{Path: "/hello", Mode: 0o644, Data: []byte(fmt.Sprint("build ", i))}}, now)
		if err != nil {
			t.Fatal(err)
		}
		o := Options{Created: now}
		img, err := o.image("amd64", v1.Config{Cmd: []string{"/hello"}}, layer{l, "test"})
		if err != nil {
			t.Fatal(err)
		}
		p, err := Push(ctx, &Image{Name: "levers9-runtag", Image: img}, PushOptions{Registry: reg.Addr() + "/t", Revision: testRevision, Now: at})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(p.RunTag, "sha-0123456789ab-"+at.Format("20060102150405")) {
			t.Errorf("run tag %q does not name the commit and time", p.RunTag)
		}
		if seen[p.RunTag] {
			t.Errorf("push %d reused run tag %s", i, p.RunTag)
		}
		seen[p.RunTag] = true
		ref, _ := name.ParseReference(p.Repository+":"+p.RunTag, name.Insecure)
		if d, err := remote.Head(ref); err != nil || d.Digest.String() != p.Digest {
			t.Errorf("%s: %v %v, want %s", ref, d, err, p.Digest)
		}
	}
	if len(seen) != 3 {
		t.Errorf("run tags %v", seen)
	}
}

// TestLoopbackRegistry: only loopback registries get plain HTTP by
// default.
func TestLoopbackRegistry(t *testing.T) {
	for ref, want := range map[string]bool{
		"127.0.0.1:5000/x/levers9-runner": true, "localhost:5000/levers9-runner": true,
		"[::1]:5000/levers9-runner": true, "registry.example:5000/levers9-runner": false,
		"10.0.0.1/levers9-runner": false,
	} {
		if got := loopbackRegistry(ref); got != want {
			t.Errorf("loopbackRegistry(%q) = %v, want %v", ref, got, want)
		}
	}
}

func TestDpkgPackages(t *testing.T) {
	status := `Package: runc
Status: install ok installed
Architecture: amd64
Version: 1.1.5+ds1-1+deb12u1
Description: runtime
 with a continuation line: Package: not-this

Package: removed
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: ca-certificates
Status: install ok installed
Architecture: all
Version: 20250419~deb12u2
`
	tests := []struct {
		name string
		only []string
		want []string
	}{
		{"all installed", nil, []string{"deb runc 1.1.5+ds1-1+deb12u1 amd64", "deb ca-certificates 20250419~deb12u2 all"}},
		{"only named", []string{"ca-certificates"}, []string{"deb ca-certificates 20250419~deb12u2 all"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := dpkgPackages([]byte(status), tc.only...)
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRootfsKey: the cache key ignores package order and duplicates, and
// changes with anything that changes the tar.
func TestRootfsKey(t *testing.T) {
	base := Rootfs{Suite: "bookworm", Variant: "minbase", Arch: "amd64", Packages: []string{"runc", "iptables"}}
	same := base
	same.Packages = []string{"iptables", "runc", "runc"}
	if base.Key() != same.Key() {
		t.Error("package order or duplicates changed the key")
	}
	for name, change := range map[string]func(*Rootfs){
		"suite":    func(r *Rootfs) { r.Suite = "trixie" },
		"variant":  func(r *Rootfs) { r.Variant = "apt" },
		"arch":     func(r *Rootfs) { r.Arch = "arm64" },
		"packages": func(r *Rootfs) { r.Packages = []string{"runc"} },
		"epoch":    func(r *Rootfs) { r.Epoch = 1 },
	} {
		r := base
		r.Packages = slices.Clone(base.Packages)
		change(&r)
		if r.Key() == base.Key() {
			t.Errorf("a different %s gives the same key", name)
		}
	}
}

// TestRewriteSuite: another release's root filesystem comes from the
// machine's own mirror, with every suite of the host's release renamed and
// nothing else changed (a *.sources name stays, mmdebstrap reads its format
// from it).
func TestRewriteSuite(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"one-line.list", "deb http://mirror.example/debian bookworm main\ndeb http://mirror.example/debian-security bookworm-security main\n",
			"deb http://mirror.example/debian trixie main\ndeb http://mirror.example/debian-security trixie-security main\n"},
		{"debian.sources", "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
			"Types: deb\nURIs: http://mirror.example/debian\nSuites: trixie trixie-updates\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"},
	}
	src, dst := t.TempDir(), t.TempDir()
	var files []string
	for _, tc := range tests {
		p := filepath.Join(src, tc.name)
		if err := os.WriteFile(p, []byte(tc.in), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	out, err := rewriteSuite(files, "bookworm", "trixie", dst)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range tests {
		if !strings.HasSuffix(out[i], tc.name) {
			t.Errorf("%s written as %s", tc.name, out[i])
		}
		b, err := os.ReadFile(out[i])
		if err != nil || string(b) != tc.want {
			t.Errorf("%s: got %q (%v), want %q", tc.name, b, err, tc.want)
		}
	}
}
