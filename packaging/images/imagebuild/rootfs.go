package imagebuild

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Rootfs is a Debian root filesystem mmdebstrap makes: the cache key is
// everything here, so the same Rootfs is built once per machine.
type Rootfs struct {
	Suite   string // bookworm
	Variant string // mmdebstrap --variant: minbase has dpkg, apt and the essentials
	Arch    string // Debian architecture: amd64
	// Packages are installed on top of the variant (--include).
	Packages []string
	// Epoch is SOURCE_DATE_EPOCH for mmdebstrap (file times, machine-id).
	Epoch int64
}

// Key is the sha256 naming the cached tar: suite, variant, architecture,
// the sorted package list and the epoch.
func (r Rootfs) Key() string {
	pkgs := slices.Clone(r.Packages)
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	h := sha256.New()
	fmt.Fprintf(h, "suite=%s\nvariant=%s\narch=%s\nepoch=%d\npackages=%s\n", r.Suite, r.Variant, r.Arch, r.Epoch, strings.Join(pkgs, ","))
	return hex.EncodeToString(h.Sum(nil))
}

// RunnerRootfs is levers9-runner's: Debian with Python, the default task
// image and the base of image recipes. The controlplane image takes its CA
// bundle from it, so that file is pinned by this cached tar, not the host.
func RunnerRootfs(epoch int64) Rootfs {
	return Rootfs{Suite: "bookworm", Variant: "minbase", Arch: "amd64", Epoch: epoch,
		Packages: []string{"ca-certificates", "python3"}}
}

// WorkerRootfs is levers9-worker's: what the agent execs or loads
// (runc; iptables-restore and iptables-save for egress; fuse3 for volume
// mounts; iproute2 for debugging a node's network; /bin/sh from the
// variant for the container holder process) and the CA bundle for the
// controlplane's TLS.
func WorkerRootfs(epoch int64) Rootfs {
	return Rootfs{Suite: "bookworm", Variant: "minbase", Arch: "amd64", Epoch: epoch,
		Packages: []string{"ca-certificates", "fuse3", "iproute2", "iptables", "runc"}}
}

// DashboardWebRootfs is levers9-dashboard-web's: Node.js and the CA
// bundle. It is Debian trixie, not bookworm, because Next.js 16 needs
// Node.js 20.9 or later and bookworm's is 18; trixie's nodejs is 20.
func DashboardWebRootfs(epoch int64) Rootfs {
	return Rootfs{Suite: "trixie", Variant: "minbase", Arch: "amd64", Epoch: epoch,
		Packages: []string{"ca-certificates", "nodejs"}}
}

// EnsureRootfs returns the cached tar of r under cacheDir/rootfs, building
// it with mmdebstrap first when it is missing (a cold build takes minutes).
// mmdebstrap is installed with apt-get when absent. Progress goes to log.
// The tar appears by an atomic rename, so an interrupted build leaves no
// half tar under the key.
func EnsureRootfs(ctx context.Context, cacheDir string, r Rootfs, log io.Writer) (string, error) {
	dir := filepath.Join(cacheDir, "rootfs")
	out := filepath.Join(dir, r.Key()+".tar")
	if st, err := os.Stat(out); err == nil && st.Mode().IsRegular() {
		return out, nil
	}
	if err := EnsureMmdebstrap(ctx, log); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("rootfs cache: %w", err)
	}
	sources, err := aptSources()
	if err != nil {
		return "", err
	}
	if host := hostCodename(); host != "" && host != r.Suite {
		// Outside the cache: a build killed here leaves nothing in it.
		srcDir, err := os.MkdirTemp("", "levers9-apt-sources-")
		if err != nil {
			return "", fmt.Errorf("apt sources: %w", err)
		}
		defer os.RemoveAll(srcDir)
		if sources, err = rewriteSuite(sources, host, r.Suite, srcDir); err != nil {
			return "", err
		}
	}
	opts, err := aptOptions(ctx)
	if err != nil {
		return "", err
	}
	removeStaleTmp(dir)
	tmp := fmt.Sprintf("%s.tmp-%d", out, os.Getpid())
	defer os.Remove(tmp)
	args := []string{"--variant=" + r.Variant, "--mode=root", "--format=tar",
		"--architectures=" + r.Arch, "--include=" + strings.Join(r.Packages, ",")}
	for _, o := range opts {
		args = append(args, "--aptopt="+o)
	}
	args = append(args, r.Suite, tmp)
	args = append(args, sources...)
	fmt.Fprintf(log, "images: building %s %s rootfs with %s (once per package list; minutes when cold)\n", r.Suite, r.Arch, strings.Join(r.Packages, ","))
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(r.Epoch, 10))
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = log, io.MultiWriter(log, &stderr)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("mmdebstrap %s rootfs (%s): %w: %s", r.Suite, strings.Join(r.Packages, ","), err, lastLine(stderr.String()))
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("rootfs cache: %w", err)
	}
	fmt.Fprintf(log, "images: rootfs cached as %s\n", out)
	return out, nil
}

// removeStaleTmp removes half-written tars of builds whose process is gone
// (killed before their deferred cleanup ran).
func removeStaleTmp(dir string) {
	tmps, _ := filepath.Glob(filepath.Join(dir, "*.tar.tmp-*"))
	for _, p := range tmps {
		_, pidStr, _ := strings.Cut(filepath.Base(p), ".tar.tmp-")
		if pid, err := strconv.Atoi(pidStr); err == nil && syscall.Kill(pid, 0) == syscall.ESRCH {
			os.Remove(p)
		}
	}
}

// EnsureMmdebstrap installs Debian's mmdebstrap when dpkg does not have it.
func EnsureMmdebstrap(ctx context.Context, log io.Writer) error {
	if installed(ctx, "mmdebstrap") {
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("mmdebstrap is not installed and installing it needs root (apt-get install mmdebstrap)")
	}
	fmt.Fprintln(log, "images: installing mmdebstrap")
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "--no-install-recommends", "mmdebstrap"}} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s mmdebstrap: %w: %s", args[0], err, lastLine(string(b)))
		}
	}
	return nil
}

func installed(ctx context.Context, pkg string) bool {
	out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Status}", pkg).Output()
	return err == nil && strings.Contains(string(out), "install ok installed")
}

// aptSources lists this machine's apt source files, which mmdebstrap takes
// as its mirrors: the mirror (or snapshot, or proxy) the machine is set up
// for, never one written into the repository.
func aptSources() ([]string, error) {
	var files []string
	if st, err := os.Stat("/etc/apt/sources.list"); err == nil && st.Size() > 0 {
		files = append(files, "/etc/apt/sources.list")
	}
	for _, pat := range []string{"/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			return nil, err
		}
		files = append(files, m...)
	}
	slices.Sort(files)
	if len(files) == 0 {
		return nil, errors.New("no apt sources on this machine (/etc/apt/sources.list or sources.list.d) for mmdebstrap")
	}
	return files, nil
}

// hostCodename is this machine's Debian codename (VERSION_CODENAME in
// /etc/os-release), "" when it cannot be read.
func hostCodename() string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VERSION_CODENAME="); ok {
			return strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return ""
}

// rewriteSuite copies the apt source files into dir with the host's suite
// names (bookworm, bookworm-updates, bookworm-security) turned into
// suite's: a root filesystem of another release comes from the same mirror
// the machine is set up for, never one written into the repository.
func rewriteSuite(files []string, host, suite, dir string) ([]string, error) {
	word := regexp.MustCompile(`\b` + regexp.QuoteMeta(host) + `\b`)
	var out []string
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("apt sources for %s: %w", suite, err)
		}
		// mmdebstrap tells the two formats apart by the file name's ending.
		p := filepath.Join(dir, fmt.Sprintf("%02d-%s", i, filepath.Base(f)))
		if err := os.WriteFile(p, word.ReplaceAll(b, []byte(suite)), 0o644); err != nil {
			return nil, fmt.Errorf("apt sources for %s: %w", suite, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// passedAptOptions are the host's apt settings mmdebstrap needs to reach the
// same mirror: a snapshot mirror's Release files are past Valid-Until, and a
// proxy is a proxy.
var passedAptOptions = []string{
	"Acquire::Check-Valid-Until", "Acquire::Check-Date",
	"Acquire::http::Proxy", "Acquire::https::Proxy",
}

// aptOptions returns the host's values of passedAptOptions as --aptopt
// arguments.
func aptOptions(ctx context.Context) ([]string, error) {
	var out []string
	for _, key := range passedAptOptions {
		b, err := exec.CommandContext(ctx, "apt-config", "shell", "V", key).Output()
		if err != nil {
			return nil, fmt.Errorf("apt-config shell %s: %w", key, err)
		}
		// Output is V='value' or nothing.
		v, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "V=")
		if !ok {
			continue
		}
		v = strings.Trim(v, "'")
		out = append(out, fmt.Sprintf("%s %q", key, v))
	}
	return out, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
