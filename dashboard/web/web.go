// Package web builds and runs the dashboard's browser app, the Next.js
// project in this directory (dashboard/web/src), for the local stack
// (make up) and the browser tests. It owns the build cache: one build per
// NEXT_PUBLIC_API_BASE and source tree under .next-build/KEY, made once and
// reused, and node_modules installed with npm ci only when package-lock.json
// changes. It never downloads anything but the npm packages the lock names,
// and knows nothing of the API beyond its base URL. Its API is internal to
// levers9 and may change.
package web

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/levers9/levers9/internal/devstack"
)

// minNode is the oldest Node.js that Next.js 16 runs on.
var minNode = [3]int{20, 9, 0}

// keepBuilds is how many builds (API bases, source versions) stay cached
// whatever their age; older ones go once unused for pruneAfter. A build is
// "used" when Make returns it, so make up's build, made or reused at each
// make up, outlives the tests' builds while a stack runs from it.
const (
	keepBuilds = 4
	pruneAfter = 24 * time.Hour
)

// BuildOptions say what to build.
type BuildOptions struct {
	// Dir is the web app's directory (dashboard/web); Find locates it.
	Dir string
	// APIBase is NEXT_PUBLIC_API_BASE: the dashboard API's URL as browsers
	// reach it ("" when the API shares the app's origin).
	APIBase string
	// Standalone builds Next.js's output "standalone" (server.js and the
	// traced node_modules under DistDir/standalone) for the
	// levers9-dashboard-web image; such a build cannot be run with
	// Command (next start).
	Standalone bool
	// Log receives npm's and Next.js's output (nil: discarded).
	Log io.Writer
}

// Build is a finished build of the web app.
type Build struct {
	Dir        string
	DistDir    string // relative to Dir, as next.config.ts reads it
	APIBase    string
	Standalone bool
	// Cached is true when an earlier build was reused; Installed when npm
	// ci ran; Took is how long Build took.
	Cached, Installed bool
	Took              time.Duration
}

// Find returns the dashboard/web directory of the levers9 checkout that
// holds dir (a directory inside it).
func Find(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "dashboard", "web", "package-lock.json")); err == nil {
			return filepath.Join(d, "dashboard", "web"), nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("find dashboard/web above %s: not in a levers9 checkout", dir)
		}
	}
}

// CheckNode reports whether Node.js and npm are here and new enough.
func CheckNode() (string, error) {
	if _, err := exec.LookPath("npm"); err != nil {
		return "", errors.New("npm not found: run make deps (packaging/dev/deps.sh installs Node.js and npm)")
	}
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		return "", fmt.Errorf("node not found: run make deps (packaging/dev/deps.sh installs Node.js): %w", err)
	}
	v := strings.TrimSpace(string(out))
	m := regexp.MustCompile(`^v(\d+)\.(\d+)\.(\d+)`).FindStringSubmatch(v)
	if m == nil {
		return "", fmt.Errorf("node --version said %q: not a version", v)
	}
	var got [3]int
	for i := range got {
		got[i], _ = strconv.Atoi(m[i+1])
	}
	for i := range got {
		if got[i] != minNode[i] {
			if got[i] < minNode[i] {
				return v, fmt.Errorf("node %s is too old: Next.js 16 needs %d.%d or later", v, minNode[0], minNode[1])
			}
			break
		}
	}
	return v, nil
}

// Make builds the web app for opts.APIBase, or reuses the build made
// earlier from the same sources, lock file and API base. Concurrent calls
// (two test packages, make up) wait for each other on a lock file.
func Make(ctx context.Context, opts BuildOptions) (*Build, error) {
	start := time.Now()
	nodeVersion, err := CheckNode()
	if err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	dir := opts.Dir
	cache := filepath.Join(dir, ".next-build")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, fmt.Errorf("create the web build cache: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(cache, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	b := &Build{Dir: dir, APIBase: opts.APIBase, Standalone: opts.Standalone}
	want, installed, err := installLocked(ctx, dir, nodeVersion, opts.Log)
	if err != nil {
		return nil, err
	}
	b.Installed = installed

	key, err := sourceKey(dir, opts.APIBase, opts.Standalone, want)
	if err != nil {
		return nil, err
	}
	b.DistDir = filepath.Join(".next-build", key)
	done := filepath.Join(dir, b.DistDir, ".levers9-built")
	if _, err := os.Stat(done); err == nil {
		b.Cached = true
		now := time.Now()
		_ = os.Chtimes(filepath.Join(dir, b.DistDir), now, now)
		b.Took = time.Since(start)
		return b, nil
	}
	_ = os.RemoveAll(filepath.Join(dir, b.DistDir))
	fmt.Fprintf(opts.Log, "web: next build for NEXT_PUBLIC_API_BASE=%s into %s\n", opts.APIBase, b.DistDir)
	if err := run(ctx, dir, opts.Log, b.env(), "node", "node_modules/next/dist/bin/next", "build"); err != nil {
		return nil, fmt.Errorf("build the web app (next build in %s): %w", dir, err)
	}
	if err := os.WriteFile(done, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("record the web build: %w", err)
	}
	prune(cache, keepBuilds)
	b.Took = time.Since(start)
	return b, nil
}

// install runs npm ci in dir when package-lock.json (or Node.js) changed
// since the last install, and reports whether it ran.
func install(ctx context.Context, dir string, log io.Writer) (bool, error) {
	nodeVersion, err := CheckNode()
	if err != nil {
		return false, err
	}
	if log == nil {
		log = io.Discard
	}
	if err := os.MkdirAll(filepath.Join(dir, ".next-build"), 0o755); err != nil {
		return false, fmt.Errorf("create the web build cache: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, ".next-build", ".lock"))
	if err != nil {
		return false, err
	}
	defer unlock()
	_, installed, err := installLocked(ctx, dir, nodeVersion, log)
	return installed, err
}

// installLocked is install with the build lock held; it returns the
// install's identity (lock file sum and Node.js version) for build keys.
func installLocked(ctx context.Context, dir, nodeVersion string, log io.Writer) (string, bool, error) {
	lockSum, err := fileSum(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		return "", false, fmt.Errorf("read the web app's package-lock.json: %w", err)
	}
	stamp := filepath.Join(dir, "node_modules", ".levers9-installed")
	want := lockSum + " " + nodeVersion + "\n"
	if old, _ := os.ReadFile(stamp); string(old) == want {
		return want, false, nil
	}
	fmt.Fprintf(log, "web: npm ci (package-lock.json changed or node_modules missing)\n")
	if err := run(ctx, dir, log, nil, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"); err != nil {
		return "", false, fmt.Errorf("install the web app's packages (npm ci in %s): %w", dir, err)
	}
	if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
		return "", false, fmt.Errorf("record the npm install: %w", err)
	}
	return want, true, nil
}

// env is what next build and next start need to agree on.
func (b *Build) env() []string {
	env := []string{
		"NEXT_PUBLIC_API_BASE=" + b.APIBase,
		"LEVERS9_WEB_DIST_DIR=" + b.DistDir,
		"NEXT_TELEMETRY_DISABLED=1",
	}
	if b.Standalone {
		env = append(env, "LEVERS9_WEB_STANDALONE=1")
	}
	return env
}

// Command returns `next start` serving this build on host:port, not yet
// started. Its environment holds only PATH, HOME and the build's settings:
// the web server needs no secret.
func (b *Build) Command(host string, port int) *exec.Cmd {
	cmd := exec.Command("node", "node_modules/next/dist/bin/next", "start", "-H", host, "-p", strconv.Itoa(port))
	cmd.Dir = b.Dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "NODE_ENV=production"}, b.env()...)
	return cmd
}

func run(ctx context.Context, dir string, log io.Writer, extraEnv []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), extraEnv...)
	var tail bytes.Buffer
	cmd.Stdout = io.MultiWriter(log, &tail)
	cmd.Stderr = io.MultiWriter(log, &tail)
	if err := cmd.Run(); err != nil {
		out := tail.String()
		if len(out) > 4000 {
			out = "…" + out[len(out)-4000:]
		}
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// sourceKey hashes what a build depends on: the sources, the config
// files, the installed packages (by lock file and Node version) and the
// API base.
func sourceKey(dir, apiBase string, standalone bool, installed string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "api=%s\nnode=%s\ngo=%s\n", apiBase, installed, runtime.GOOS)
	if standalone {
		// Appended only when set, so the keys of existing builds stay.
		fmt.Fprintf(h, "standalone\n")
	}
	files := []string{"package.json", "package-lock.json", "next.config.ts", "tsconfig.json"}
	err := filepath.WalkDir(filepath.Join(dir, "src"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("list the web app's sources: %w", err)
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", fmt.Errorf("read %s: %w", f, err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func fileSum(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]), nil
}

// prune removes builds beyond the keep most recently used that have not
// been used for pruneAfter.
func prune(cache string, keep int) {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	type build struct {
		name string
		mod  time.Time
	}
	var builds []build
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if info, err := e.Info(); err == nil {
			builds = append(builds, build{e.Name(), info.ModTime()})
		}
	}
	sort.Slice(builds, func(i, j int) bool { return builds[i].mod.After(builds[j].mod) })
	for _, b := range builds[min(keep, len(builds)):] {
		if time.Since(b.mod) > pruneAfter {
			_ = os.RemoveAll(filepath.Join(cache, b.name))
		}
	}
}

// lockFile takes an exclusive flock on path, waiting while ctx allows.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the web build lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for another web build to finish: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Server is a running `next start` started by Serve.
type Server struct {
	// URL is where it answers, http://127.0.0.1:PORT.
	URL  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Serve starts this build on a free port of 127.0.0.1, its output going to
// out, and returns once it answers HTTP (or within 60s, an error).
func (b *Build) Serve(ctx context.Context, out io.Writer) (*Server, error) {
	port, err := devstack.FreePort()
	if err != nil {
		return nil, err
	}
	cmd := b.Command("127.0.0.1", port)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the web app (next start): %w", err)
	}
	s := &Server{URL: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	if err := WaitHTTP(ctx, s.URL+"/signin", 60*time.Second, s.done); err != nil {
		s.Stop()
		return nil, fmt.Errorf("the web app (next start): %w", err)
	}
	return s, nil
}

// Stop ends the server and waits for it; safe twice.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	// next start runs workers of its own: end the whole process group.
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
}

// WaitHTTP polls url until it answers below 500, the process ends
// (exited closes), ctx ends or d passes.
func WaitHTTP(ctx context.Context, url string, d time.Duration, exited <-chan struct{}) error {
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("the process exited before %s answered", url)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not answer within %s", url, d)
}

// APIPortForTest is the dashboard API port the tests prefer, so that the
// header tests here and the browser test (test/e2e) share one cached build:
// the API base is part of the build.
const APIPortForTest = 19970
