// Package agentdist owns handing the agent binary to machines that join:
// it finds prebuilt binaries (levers9-agent-linux-amd64, …, or a plain
// levers9-agent for the controlplane's own platform) in one directory,
// computes their checksums for join scripts, and serves them over HTTP
// without a token (a binary is not a secret; the script verifies the
// checksum it was written with). Only when dev builds are on does it build
// the agent from source for a platform with no prebuilt binary, one build at
// a time, at most once a minute per platform, and a failed build is answered
// from memory for five minutes, so requests cannot keep it compiling. It
// never serves anything outside that directory or its own build cache, and
// never names either directory in an error a caller sees (it logs them).
package agentdist

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// Platforms are the platforms join scripts know.
var Platforms = []string{"linux-amd64", "linux-arm64"}

var platformRE = regexp.MustCompile(`^linux-(amd64|arm64)$`)

// Dist finds, builds and serves agent binaries. Safe for concurrent use.
type Dist struct {
	dir       string
	devBuilds bool
	sourceDir string
	cacheDir  string
	log       *slog.Logger
	clock     clock.Clock // times dev builds
	goBin     string      // the go command dev builds run

	// buildMu makes dev builds one at a time; a request that waited for it
	// finds the result of the build it waited for.
	buildMu sync.Mutex

	// mu guards the sums and builds maps; a buildState's fields are
	// guarded by buildMu.
	mu     sync.Mutex
	sums   map[string]cachedSum   // by path
	builds map[string]*buildState // by platform
}

// Dev builds are limited so a stream of download requests cannot keep the
// controlplane compiling: at most one attempt per platform per
// buildInterval, a failure answered from memory for failureTTL, and each
// build bounded by buildTimeout, detached from the request that started it.
const (
	buildInterval = time.Minute
	failureTTL    = 5 * time.Minute
	buildTimeout  = 10 * time.Minute
)

// buildState is one platform's dev build: its output once built, else when
// it was last tried and whether that failed.
type buildState struct {
	path    string
	lastTry time.Time
	failed  bool
}

type cachedSum struct {
	size    int64
	modTime time.Time
	sum     string
}

// New makes a Dist over dir. devBuilds with sourceDir (a levers9 checkout)
// allows building missing platforms.
func New(dir string, devBuilds bool, sourceDir string, log *slog.Logger) *Dist {
	return &Dist{dir: dir, devBuilds: devBuilds, sourceDir: sourceDir, log: log, clock: clock.Real(), goBin: "go",
		sums: map[string]cachedSum{}, builds: map[string]*buildState{}}
}

// DefaultDir is the directory of the running executable.
func DefaultDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "."
	}
	return filepath.Dir(exe)
}

// FindSource walks up from dir looking for the levers9 module's go.mod.
func FindSource(dir string) (string, bool) {
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/levers9/levers9\n") {
			return d, true
		}
		if filepath.Dir(d) == d {
			return "", false
		}
	}
}

// prebuilt returns the prebuilt binary for platform, if there is one.
func (d *Dist) prebuilt(platform string) (string, bool) {
	candidates := []string{filepath.Join(d.dir, "levers9-agent-"+platform)}
	if platform == runtime.GOOS+"-"+runtime.GOARCH {
		candidates = append(candidates, filepath.Join(d.dir, "levers9-agent"))
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			return c, true
		}
	}
	return "", false
}

// Path returns the binary for platform, building it when dev builds are on
// and no prebuilt one exists.
func (d *Dist) Path(ctx context.Context, platform string) (string, error) {
	if !platformRE.MatchString(platform) {
		return "", fmt.Errorf("platform %q is not one of %v: %w", platform, Platforms, errdefs.ErrInvalidArgument)
	}
	if p, ok := d.prebuilt(platform); ok {
		return p, nil
	}
	if !d.devBuilds || d.sourceDir == "" {
		// The directory is the operator's to know, not a caller's: it is
		// logged, never returned.
		d.log.Debug("no prebuilt agent for a platform", "platform", platform, "dir", d.dir)
		return "", fmt.Errorf("no prebuilt agent for %s on this controlplane (put levers9-agent-%s in controlplane.agentBinariesDir, or set LEVERS9_AGENT_DEV_BUILDS=true to build from source): %w", platform, platform, errdefs.ErrNotFound)
	}
	return d.build(ctx, platform)
}

// build compiles the agent for platform from the source checkout, within
// the limits above. Its errors name no directory and carry no compiler
// output (both are logged).
func (d *Dist) build(ctx context.Context, platform string) (string, error) {
	d.buildMu.Lock()
	defer d.buildMu.Unlock()
	d.mu.Lock()
	st := d.builds[platform]
	if st == nil {
		st = &buildState{}
		d.builds[platform] = st
	}
	d.mu.Unlock()
	if st.path != "" {
		return st.path, nil
	}
	now := d.clock.Now()
	if !st.lastTry.IsZero() {
		since := now.Sub(st.lastTry)
		if st.failed && since < failureTTL {
			return "", fmt.Errorf("the dev build of the agent for %s failed %s ago; it is tried again %s after a failure (see the controlplane log): %w",
				platform, since.Round(time.Second), failureTTL, errdefs.ErrUnavailable)
		}
		if since < buildInterval {
			return "", fmt.Errorf("the agent for %s was built %s ago; dev builds run at most once a minute per platform: %w",
				platform, since.Round(time.Second), errdefs.ErrUnavailable)
		}
	}
	st.lastTry, st.failed = now, true
	if d.cacheDir == "" {
		dir, err := os.MkdirTemp("", "levers9-agent-builds-")
		if err != nil {
			d.log.Error("dev build: making the build cache failed", "err", err)
			return "", fmt.Errorf("the dev build of the agent for %s failed (see the controlplane log): %w", platform, errdefs.ErrUnavailable)
		}
		d.cacheDir = dir
	}
	out := filepath.Join(d.cacheDir, "levers9-agent-"+platform)
	goos, goarch, _ := strings.Cut(platform, "-")
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(bctx, d.goBin, "build", "-o", out, "./cmd/levers9-agent")
	cmd.Dir = d.sourceDir
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
	start := d.clock.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		d.log.Error("dev build of the agent failed; answering from memory until it is retried", "platform", platform,
			"source_dir", d.sourceDir, "retry_after", failureTTL.String(), "err", err, "output", string(b))
		return "", fmt.Errorf("the dev build of the agent for %s failed (see the controlplane log): %w", platform, errdefs.ErrUnavailable)
	}
	d.log.Info("built the agent from source (dev builds are on)", "platform", platform, "took", d.clock.Since(start).Round(time.Millisecond))
	st.path, st.failed = out, false
	return out, nil
}

// DevChecksums builds the agent from source for the controlplane's own
// platform (even when a prebuilt one exists) and returns its checksum.
func (d *Dist) DevChecksums(ctx context.Context) (map[string]string, error) {
	if !d.devBuilds || d.sourceDir == "" {
		return nil, fmt.Errorf("dev builds are off on this controlplane (set LEVERS9_AGENT_DEV_BUILDS=true and run it from a levers9 checkout): %w", errdefs.ErrFailedPrecondition)
	}
	host := runtime.GOOS + "-" + runtime.GOARCH
	p, err := d.build(ctx, host)
	if err != nil {
		return nil, err
	}
	sum, err := d.checksum(p)
	if err != nil {
		return nil, err
	}
	return map[string]string{host: sum}, nil
}

// Checksums returns the SHA-256 of every platform's agent that is
// available (building the controlplane's own platform in dev mode).
func (d *Dist) Checksums(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	host := runtime.GOOS + "-" + runtime.GOARCH
	for _, pl := range Platforms {
		var (
			p   string
			err error
		)
		if pl == host {
			p, err = d.Path(ctx, pl)
		} else if pp, ok := d.prebuilt(pl); ok {
			p = pp
		} else {
			continue
		}
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sum, err := d.checksum(p)
		if err != nil {
			return nil, err
		}
		out[pl] = sum
	}
	if len(out) == 0 {
		d.log.Warn("no agent binary to hand to machines", "dir", d.dir)
		return nil, fmt.Errorf("no agent binary to hand to machines: put levers9-agent-linux-amd64 in controlplane.agentBinariesDir, or set LEVERS9_AGENT_DEV_BUILDS=true: %w", errdefs.ErrFailedPrecondition)
	}
	return out, nil
}

func (d *Dist) checksum(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	c, ok := d.sums[path]
	d.mu.Unlock()
	if ok && c.size == st.Size() && c.modTime.Equal(st.ModTime()) {
		return c.sum, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("checksum %s: %w", path, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	d.mu.Lock()
	d.sums[path] = cachedSum{size: st.Size(), modTime: st.ModTime(), sum: sum}
	d.mu.Unlock()
	return sum, nil
}

// ServeHTTP serves GET /agent/v1/download/{platform}.
func (d *Dist) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	platform := strings.TrimPrefix(r.URL.Path, "/agent/v1/download/")
	var (
		p   string
		err error
	)
	if r.URL.Query().Get("dev") == "1" {
		if !d.devBuilds || d.sourceDir == "" {
			http.Error(w, "dev builds are off on this controlplane", http.StatusNotFound)
			return
		}
		if !platformRE.MatchString(platform) {
			http.Error(w, "unknown platform", http.StatusBadRequest)
			return
		}
		p, err = d.build(r.Context(), platform)
	} else {
		p, err = d.Path(r.Context(), platform)
	}
	switch {
	case errdefs.IsInvalidArgument(err):
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	case errdefs.IsNotFound(err):
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	case errdefs.IsUnavailable(err):
		w.Header().Set("Retry-After", "60")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	case err != nil:
		d.log.Error("agent download failed", "platform", platform, "err", err)
		http.Error(w, "agent build failed; see the controlplane log", http.StatusInternalServerError)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		http.Error(w, "agent binary unreadable", http.StatusInternalServerError)
		return
	}
	defer f.Close()
	st, _ := f.Stat()
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "levers9-agent-"+platform, st.ModTime(), f)
}
