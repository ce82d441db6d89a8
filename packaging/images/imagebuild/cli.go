package imagebuild

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/levers9/levers9/dashboard/web"
)

// DefaultSource is the org.opencontainers.image.source label.
const DefaultSource = "https://github.com/levers9/levers9"

// CacheRoot is ${XDG_CACHE_HOME:-$HOME/.cache}/levers9.
func CacheRoot() (string, error) {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "levers9"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("cache dir: %w", err)
	}
	return filepath.Join(home, ".cache", "levers9"), nil
}

// Main is `go run ./packaging/images` from the root of a checkout (root):
// build the named images from dist/ and push each under --tag and a run
// tag, or with --rootfs-only just fill the root filesystem cache.
func Main(ctx context.Context, root string, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.SetOutput(stderr)
	registry := fs.String("registry", "", "where images go: host[:port]/prefix (images are PREFIX/levers9-NAME)")
	tag := fs.String("tag", "latest", "the tag deployments follow; every build also pushes a run tag sha-COMMIT-TIME")
	images := fs.String("images", strings.Join(Names, ","), "comma list of images to build")
	dist := fs.String("dist", "dist", "release binaries (make release); package lists and digests go to DIST/images")
	insecure := fs.Bool("insecure", false, "plain HTTP to a registry that is not on loopback (loopback always is)")
	rootfsOnly := fs.Bool("rootfs-only", false, "only build the cached root filesystems the images need, push nothing")
	cpPlatforms := fs.String("controlplane-platforms", "amd64,arm64", "architectures of the controlplane image index")
	source := fs.String("source", DefaultSource, "org.opencontainers.image.source")
	apiBase := fs.String("dashboard-api-base", "", "NEXT_PUBLIC_API_BASE the dashboard-web image is built for: the dashboard API's URL as browsers reach it (empty: the app's own origin); fixed in the image")
	if err := fs.Parse(args); err != nil {
		return err
	}
	names := splitList(*images)
	for _, n := range names {
		if _, err := RootfsFor(n, 0); err != nil {
			return err
		}
	}
	cache, err := CacheRoot()
	if err != nil {
		return err
	}
	if *rootfsOnly {
		for _, n := range names {
			rs, _ := RootfsFor(n, 0)
			for _, r := range rs {
				if _, err := EnsureRootfs(ctx, cache, r, stderr); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if *registry == "" {
		return errors.New("--registry is required (host[:port]/prefix)")
	}
	rev, created, err := gitRevision(ctx, root)
	if err != nil {
		return err
	}
	version := "dev"
	if b, err := os.ReadFile(filepath.Join(*dist, "VERSION")); err == nil {
		version = strings.TrimSpace(string(b))
	}
	o := Options{DistDir: *dist, CacheDir: cache, Source: *source, Revision: rev, Version: version,
		Created: created, ControlplanePlatforms: splitList(*cpPlatforms), Log: stderr}
	for _, n := range names {
		switch n {
		case "worker":
			if o.Runsc, err = EnsureRunsc(ctx, root, cache, stderr); err != nil {
				return err
			}
			if o.Weed, err = EnsureWeed(ctx, root, stderr); err != nil {
				return err
			}
		case "dashboard-web":
			if o.Web, err = BuildWeb(ctx, root, *apiBase, stderr); err != nil {
				return err
			}
		}
	}
	now := time.Now()
	for _, n := range names {
		img, err := Build(ctx, n, o)
		if err != nil {
			return err
		}
		if err := img.WriteOutputs(filepath.Join(*dist, "images")); err != nil {
			return err
		}
		p, err := Push(ctx, img, PushOptions{Registry: *registry, Tag: *tag, Revision: rev, Now: now, Insecure: *insecure, Log: stderr})
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "images: %s@%s tags %s %s\n", p.Repository, p.Digest, p.Tag, p.RunTag)
	}
	return nil
}

// gitRevision is HEAD's commit and commit time (SOURCE_DATE_EPOCH, when
// set, wins for the time).
func gitRevision(ctx context.Context, root string) (string, time.Time, error) {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "show", "-s", "--format=%H %ct", "HEAD").Output()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("git revision of %s: %w", root, err)
	}
	rev, ct, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		ct = v
	}
	sec, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("commit time %q: %w", ct, err)
	}
	return rev, time.Unix(sec, 0).UTC(), nil
}

// BuildWeb makes (or reuses) the standalone build of root's dashboard/web
// for apiBase, the build the dashboard-web image carries. It needs Node.js
// 20.9 or later and npm on this machine (make deps).
func BuildWeb(ctx context.Context, root, apiBase string, log io.Writer) (*web.Build, error) {
	dir, err := web.Find(root)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "images: building dashboard/web (standalone) for NEXT_PUBLIC_API_BASE=%q\n", apiBase)
	b, err := web.Make(ctx, web.BuildOptions{Dir: dir, APIBase: apiBase, Standalone: true, Log: log})
	if err != nil {
		return nil, fmt.Errorf("dashboard-web image: %w", err)
	}
	return b, nil
}

// EnsureRunsc returns the pinned runsc in the cache
// (CACHE/runsc/VERSION/runsc, the version packaging/runsc/go.mod pins),
// running packaging/dev/runsc.sh first when it is not there.
func EnsureRunsc(ctx context.Context, root, cache string, log io.Writer) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Version}}", "gvisor.dev/gvisor")
	cmd.Dir = filepath.Join(root, "packaging", "runsc")
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("pinned runsc version: %w", err)
	}
	path := filepath.Join(cache, "runsc", strings.TrimSpace(string(out)), "runsc")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	build := exec.CommandContext(ctx, "bash", filepath.Join(root, "packaging", "dev", "runsc.sh"))
	build.Stdout, build.Stderr = log, log
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("build the pinned runsc: %w", err)
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("pinned runsc: %w", err)
	}
	return path, nil
}

// WeedBuildScript is the script that builds and caches the pinned weed,
// relative to the root of a checkout.
const WeedBuildScript = "packaging/seaweedfs/build.sh"

// EnsureWeed returns the pinned SeaweedFS weed, built by root's
// packaging/seaweedfs/build.sh: the same script, cache
// (CACHE/seaweedfs/VERSION-KEY/weed) and lock the tests' weed comes from
// (internal/seaweed/seaweedtest), so it is built at most once per pinned
// version (instant when cached, 7-10 minutes cold).
func EnsureWeed(ctx context.Context, root string, log io.Writer) (string, error) {
	script := filepath.Join(root, WeedBuildScript)
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout, cmd.Stderr = &stdout, log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build the pinned weed (%s): %w", script, err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	path := lines[len(lines)-1]
	if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("pinned weed: %s printed %q, not an executable file (%v)", script, path, err)
	}
	return path, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
