// Package seaweedfs is the volumes driver over SeaweedFS, the one levers9
// tests: a volume is a filer directory (/levers9/volumes/WORKSPACE/ID)
// whose files go to a SeaweedFS collection of its own, so the mount's
// collection quota caps it (a write past it fails with ENOSPC). A node
// mounts it with `weed mount` (FUSE), supervised: a mount process that
// dies is restarted, and UnmountAll removes what a killed agent left.
//
// Credentials: the driver signs its filer requests with Config.FilerKeys;
// a mount's credentials (seaweed.MountCredentials, in Config.Env or the
// mount's MountOptions.Env) go to weed mount as 0600 files and a 0600
// security.toml in the mount's state directory, its working directory,
// removed at Unmount; other WEED_* settings go to its environment. None
// ever goes in argv or an error. Its API is internal to levers9 and may
// change.
package seaweedfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/seaweed"
	"github.com/levers9/levers9/volumes"
)

// DriverName is how volumes record this driver.
const DriverName = "seaweedfs"

// FSType is the mount table's type for a weed mount.
const FSType = "fuse.seaweedfs"

// Root is where volumes live in the filer.
const Root = "/levers9/volumes"

// Config is what a driver needs to reach a cluster.
type Config struct {
	// Bin is the weed binary (needed to mount; not to create or delete).
	Bin string
	// FilerAddr is host:port.grpcPort, what weed mount dials.
	FilerAddr string
	// FilerURL is the filer's HTTP base URL (create, delete, stats).
	FilerURL string
	// Env is the credentials and settings for every weed mount, KEY=VALUE:
	// seaweed.MountCredentials' entries (written to 0600 files) and WEED_
	// keys (given to the process's environment). A mount's
	// MountOptions.Env adds to it.
	Env []string
	// FilerKeys sign the driver's requests to the filer's HTTP API.
	FilerKeys seaweed.FilerKeys
	// StateDir holds each mount's log and cache.
	StateDir string
	Logger   *slog.Logger
}

// Driver implements volumes.Driver over SeaweedFS.
type Driver struct {
	cfg   Config
	filer *seaweed.Filer

	// mu guards mounts.
	mu sync.Mutex
	// mounts are the supervised weed mount processes by target.
	mounts map[string]*seaweed.Process
}

var (
	_ volumes.Driver     = (*Driver)(nil)
	_ volumes.Reconciler = (*Driver)(nil)
)

// New returns a driver for cfg.
func New(cfg Config) *Driver {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Driver{cfg: cfg, filer: &seaweed.Filer{URL: cfg.FilerURL, Keys: cfg.FilerKeys}, mounts: map[string]*seaweed.Process{}}
}

// Name is "seaweedfs".
func (d *Driver) Name() string { return DriverName }

var idRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,100}$`)

func check(v volumes.Volume) error {
	var errs []error
	if !idRE.MatchString(v.ID) {
		errs = append(errs, fmt.Errorf("volume id %q: want 1-100 of [a-zA-Z0-9_-]: %w", v.ID, errdefs.ErrInvalidArgument))
	}
	if !idRE.MatchString(v.Workspace) {
		errs = append(errs, fmt.Errorf("volume %s: workspace %q: want 1-100 of [a-zA-Z0-9_-]: %w", v.ID, v.Workspace, errdefs.ErrInvalidArgument))
	}
	if v.QuotaBytes < 0 {
		errs = append(errs, fmt.Errorf("volume %s: negative quota: %w", v.ID, errdefs.ErrInvalidArgument))
	}
	return errors.Join(errs...)
}

// Dir is the volume's filer directory.
func Dir(v volumes.Volume) string { return path.Join(Root, v.Workspace, v.ID) }

// Collection is the SeaweedFS collection holding the volume's chunks.
func Collection(v volumes.Volume) string { return "l9v_" + strings.ReplaceAll(v.ID, "-", "_") }

// Create makes the volume's filer directory.
func (d *Driver) Create(ctx context.Context, v volumes.Volume) error {
	if err := check(v); err != nil {
		return err
	}
	if err := d.filer.Mkdir(ctx, Dir(v)); err != nil {
		return fmt.Errorf("creating volume %s: %w", v.ID, errdefs.WithRetry(err, true))
	}
	return nil
}

// Delete removes the volume's directory and everything in it.
func (d *Driver) Delete(ctx context.Context, v volumes.Volume) error {
	if err := check(v); err != nil {
		return err
	}
	if err := d.filer.Delete(ctx, Dir(v)); err != nil {
		return fmt.Errorf("deleting volume %s: %w", v.ID, err)
	}
	return nil
}

// Stats walks the volume's directory.
func (d *Driver) Stats(ctx context.Context, v volumes.Volume) (volumes.Stats, error) {
	if err := check(v); err != nil {
		return volumes.Stats{}, err
	}
	u, err := d.filer.Usage(ctx, Dir(v))
	if errors.Is(err, seaweed.ErrNotFound) {
		return volumes.Stats{}, fmt.Errorf("stats of volume %s: %w", v.ID, errdefs.ErrNotFound)
	}
	if err != nil {
		return volumes.Stats{}, fmt.Errorf("stats of volume %s: %w", v.ID, err)
	}
	return volumes.Stats{Bytes: u.Bytes, Files: u.Files, Dirs: u.Dirs}, nil
}

// Filer is the driver's filer client (for put/get/ls of volume files).
func (d *Driver) Filer() *seaweed.Filer { return d.filer }

// MountArgs is weed mount's argv (after the binary) for a volume: no
// credential is ever among them.
func (d *Driver) MountArgs(v volumes.Volume, target, cacheDir string, opts volumes.MountOptions) []string {
	args := []string{
		"mount",
		"-filer=" + d.cfg.FilerAddr,
		"-filer.path=" + Dir(v),
		"-dir=" + target,
		"-collection=" + Collection(v),
		"-cacheDir=" + cacheDir,
		"-volumeName=l9-" + v.ID,
		"-allowOthers=true",
		// The task may run as any uid; levers9 does not map users.
		"-defaultPermissions=false",
		"-umask=000",
		"-localSocket=" + socketFor(target),
	}
	if v.QuotaBytes > 0 {
		// weed counts the quota in whole MiB; round up so a quota is never
		// smaller than asked.
		args = append(args, "-collectionQuotaMB="+strconv.FormatInt((v.QuotaBytes+(1<<20)-1)>>20, 10))
	}
	if opts.ReadOnly {
		args = append(args, "-readOnly=true")
	}
	return args
}

// stateFor is the per-target directory for the mount's log and cache,
// named by a hash of the target so deep targets stay short.
func (d *Driver) stateFor(target string) string {
	return filepath.Join(d.cfg.StateDir, "mounts", targetKey(target))
}

func targetKey(target string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(target)))
	return hex.EncodeToString(sum[:8])
}

// socketFor is weed mount's control socket: a unix socket path must stay
// under 108 bytes, which a state directory deep in a test's temp dir does
// not, so it goes in the system's temp dir, named by the target's hash.
// weed does not remove it when it exits, so the driver does (removeSocket)
// wherever it ends a mount; this is the one place that names it.
func socketFor(target string) string {
	return filepath.Join(os.TempDir(), "l9-weed-"+targetKey(target)+".sock")
}

// removeSocket removes the control socket of a mount at target, once its
// process is gone: a socket that is not there is fine.
func removeSocket(target string) error {
	if err := os.Remove(socketFor(target)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing weed mount's control socket: %w", err)
	}
	return nil
}

// Mount mounts the volume at target with a supervised weed mount and
// returns once the kernel shows the FUSE filesystem there.
func (d *Driver) Mount(ctx context.Context, v volumes.Volume, target string, opts volumes.MountOptions) error {
	if err := check(v); err != nil {
		return err
	}
	if d.cfg.Bin == "" || d.cfg.FilerAddr == "" {
		return fmt.Errorf("mounting volume %s: the driver has no weed binary or filer address: %w", v.ID, errdefs.ErrFailedPrecondition)
	}
	target = filepath.Clean(target)
	d.mu.Lock()
	if _, ok := d.mounts[target]; ok {
		d.mu.Unlock()
		return fmt.Errorf("mounting volume %s at %s: already mounted there: %w", v.ID, target, errdefs.ErrAlreadyExists)
	}
	d.mu.Unlock()
	state := d.stateFor(target)
	cache := filepath.Join(state, "cache")
	for _, dir := range []string{target, cache} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("mounting volume %s: %w", v.ID, err)
		}
	}
	if err := os.Chmod(target, 0o755); err != nil {
		return fmt.Errorf("mounting volume %s: %w", v.ID, err)
	}
	creds, env := seaweed.SplitMountEnv(append(slices.Clone(d.cfg.Env), opts.Env...))
	if !creds.Empty() {
		// weed reads ./security.toml first: the state dir is its working
		// directory.
		if err := creds.WriteMountConfig(state); err != nil {
			return fmt.Errorf("mounting volume %s: %w", v.ID, err)
		}
	}
	p := &seaweed.Process{
		Name: "weed-mount-" + v.ID, Bin: d.cfg.Bin,
		Args:    d.MountArgs(v, target, cache, opts),
		Env:     env,
		Dir:     state,
		LogPath: filepath.Join(state, "mount.log"),
		Logger:  d.cfg.Logger.With("volume_id", v.ID, "target", target),
		Restart: true,
	}
	// A dead mount process leaves "transport endpoint is not connected"
	// behind, which weed mount cannot mount over: clear it before each
	// (re)start. Restart only runs the process again; clearing a stale
	// mount is the Reconcile's job, so clear it once here too.
	_ = unmountTarget(target)
	if err := p.Start(ctx); err != nil {
		return fmt.Errorf("mounting volume %s: %w", v.ID, err)
	}
	if err := waitMounted(ctx, target, 60*time.Second, p); err != nil {
		_ = p.Stop()
		_ = unmountTarget(target)
		_ = removeSocket(target)
		removeMountConfig(state)
		return fmt.Errorf("mounting volume %s at %s: %w (log %s)", v.ID, target, err, p.LogPath)
	}
	d.mu.Lock()
	d.mounts[target] = p
	d.mu.Unlock()
	go d.watch(target, p)
	return nil
}

// watch remounts when the kernel mount goes away while the process was
// meant to keep it (a crashed weed leaves a dead FUSE endpoint; the
// supervisor's restart then needs the dead mount cleared).
func (d *Driver) watch(target string, p *seaweed.Process) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	lastPID := p.PID()
	for {
		select {
		case <-p.Done():
			return
		case <-t.C:
		}
		pid := p.PID()
		if pid != lastPID {
			// Restarted by the supervisor: the old FUSE endpoint is dead.
			// weed mount refuses a busy dir only when mounted by itself,
			// so the restart succeeds once the dead endpoint is detached.
			d.cfg.Logger.Warn("weed mount restarted; volume remounted", "target", target, "pid", pid)
			lastPID = pid
		}
		if healthy(target) {
			continue
		}
		_ = unmountTarget(target)
	}
}

// healthy reports whether target is a working weed mount.
func healthy(target string) bool {
	m, ok, err := volumes.MountedAt(target)
	if err != nil || !ok || m.FSType != FSType {
		return false
	}
	var st syscall.Stat_t
	return syscall.Stat(target, &st) == nil
}

func waitMounted(ctx context.Context, target string, within time.Duration, p *seaweed.Process) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if healthy(target) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("no %s mount after %s (mount process pid %d)", FSType, within, p.PID())
}

// MountPID is the pid of the weed mount process serving target, or 0.
func (d *Driver) MountPID(target string) int {
	d.mu.Lock()
	p := d.mounts[filepath.Clean(target)]
	d.mu.Unlock()
	if p == nil {
		return 0
	}
	return p.PID()
}

// Unmount stops the mount's process (weed unmounts on SIGTERM) and makes
// sure the kernel mount is gone.
func (d *Driver) Unmount(ctx context.Context, target string) error {
	target = filepath.Clean(target)
	d.mu.Lock()
	p := d.mounts[target]
	delete(d.mounts, target)
	d.mu.Unlock()
	var errs []error
	if p != nil {
		errs = append(errs, p.Stop())
	}
	if err := unmountTarget(target); err != nil {
		errs = append(errs, err)
	}
	// The process is stopped: its socket is left over.
	if err := removeSocket(target); err != nil {
		errs = append(errs, err)
	}
	if d.cfg.StateDir != "" {
		removeMountConfig(d.stateFor(target))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("unmounting %s: %w", target, err)
	}
	return nil
}

// removeMountConfig removes the credentials WriteMountConfig left in a
// mount's state directory.
func removeMountConfig(state string) {
	for _, f := range seaweed.MountConfigFiles {
		_ = os.Remove(filepath.Join(state, f))
	}
}

// UnmountAll unmounts every weed mount under root, its own and those a
// killed agent left (whose processes are gone or orphaned).
func (d *Driver) UnmountAll(ctx context.Context, root string) ([]string, error) {
	d.mu.Lock()
	var own []string
	for t := range d.mounts {
		if t == filepath.Clean(root) || strings.HasPrefix(t, filepath.Clean(root)+"/") {
			own = append(own, t)
		}
	}
	d.mu.Unlock()
	var done []string
	var errs []error
	for _, t := range own {
		if err := d.Unmount(ctx, t); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, t)
	}
	left, err := volumes.MountsUnder(root, FSType)
	if err != nil {
		return done, err
	}
	for _, m := range left {
		if err := unmountTarget(m.Target); err != nil {
			errs = append(errs, err)
			continue
		}
		// A killed agent's mount process is gone or, detached from its
		// mount, serves nothing: its socket goes too.
		if err := removeSocket(m.Target); err != nil {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m.Target, err))
		}
		if d.cfg.StateDir != "" {
			// A killed agent's mount left its credentials too.
			removeMountConfig(d.stateFor(m.Target))
		}
		done = append(done, m.Target)
	}
	return done, errors.Join(errs...)
}

// unmountTarget detaches whatever is mounted at target (lazily, so a busy
// or dead FUSE endpoint goes too); nothing mounted is fine.
func unmountTarget(target string) error {
	for range 5 {
		m, ok, err := volumes.MountedAt(target)
		if err != nil {
			return err
		}
		if !ok || !strings.HasPrefix(m.FSType, "fuse") {
			return nil
		}
		if err := syscall.Unmount(target, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("unmounting %s: %w", target, err)
		}
	}
	return nil
}

var _ volumes.Files = (*Driver)(nil)

func fileInfo(v volumes.Volume, e seaweed.Entry) volumes.FileInfo {
	rel := strings.TrimPrefix(path.Clean(e.FullPath), Dir(v))
	if rel == "" {
		rel = "/"
	}
	return volumes.FileInfo{Path: rel, Dir: e.IsDir(), Size: e.Size(), ModTime: e.Mtime}
}

// stat returns the entry at p of the volume; the root is a directory.
func (d *Driver) stat(ctx context.Context, v volumes.Volume, p string) (seaweed.Entry, error) {
	full := path.Join(Dir(v), p)
	if p == "/" {
		return seaweed.Entry{FullPath: full, Mode: os.ModeDir}, nil
	}
	e, err := d.filer.Stat(ctx, full)
	if errors.Is(err, seaweed.ErrNotFound) {
		return e, fmt.Errorf("%s: %w", p, errdefs.ErrNotFound)
	}
	return e, err
}

// ListFiles lists a directory of the volume, or gives a file's entry.
func (d *Driver) ListFiles(ctx context.Context, v volumes.Volume, p string) ([]volumes.FileInfo, error) {
	if err := check(v); err != nil {
		return nil, err
	}
	e, err := d.stat(ctx, v, p)
	if err != nil {
		return nil, fmt.Errorf("listing %s in volume %s: %w", p, v.ID, err)
	}
	if !e.IsDir() {
		return []volumes.FileInfo{fileInfo(v, e)}, nil
	}
	entries, err := d.filer.List(ctx, path.Join(Dir(v), p))
	if err != nil {
		return nil, fmt.Errorf("listing %s in volume %s: %w", p, v.ID, err)
	}
	out := make([]volumes.FileInfo, 0, len(entries))
	for _, e := range entries {
		out = append(out, fileInfo(v, e))
	}
	return out, nil
}

// OpenFile opens a file of the volume; a directory is refused, as the
// filer would answer it with a listing.
func (d *Driver) OpenFile(ctx context.Context, v volumes.Volume, p string) (io.ReadCloser, error) {
	if err := check(v); err != nil {
		return nil, err
	}
	e, err := d.stat(ctx, v, p)
	if err != nil {
		return nil, fmt.Errorf("reading %s in volume %s: %w", p, v.ID, err)
	}
	if e.IsDir() {
		return nil, fmt.Errorf("reading %s in volume %s: is a directory: %w", p, v.ID, errdefs.ErrInvalidArgument)
	}
	rc, err := d.filer.Get(ctx, path.Join(Dir(v), p))
	if err != nil {
		return nil, fmt.Errorf("reading %s in volume %s: %w", p, v.ID, err)
	}
	return rc, nil
}

// quotaReader fails once more than left bytes have come through, so an
// upload past the quota stops at the quota rather than at its end.
type quotaReader struct {
	r    io.Reader
	left int64
	full bool
}

func (q *quotaReader) Read(b []byte) (int, error) {
	n, err := q.r.Read(b)
	q.left -= int64(n)
	if q.left < 0 {
		q.full = true
		return n, volumes.ErrFull
	}
	return n, err
}

// PutFile uploads to a temporary name beside p and renames it over p once
// complete, so p never holds a part; on failure the temporary file goes.
// The filer itself enforces no quota (only weed mount does), so the quota
// is checked here against the volume's usage, less the file being
// replaced.
func (d *Driver) PutFile(ctx context.Context, v volumes.Volume, p string, r io.Reader) (volumes.FileInfo, error) {
	if err := check(v); err != nil {
		return volumes.FileInfo{}, err
	}
	if p == "/" {
		return volumes.FileInfo{}, fmt.Errorf("writing the root of volume %s: is a directory: %w", v.ID, errdefs.ErrInvalidArgument)
	}
	full := path.Join(Dir(v), p)
	var replaced uint64
	switch e, err := d.stat(ctx, v, p); {
	case err == nil && e.IsDir():
		return volumes.FileInfo{}, fmt.Errorf("writing %s in volume %s: is a directory: %w", p, v.ID, errdefs.ErrInvalidArgument)
	case err == nil:
		replaced = e.Size()
	case !errdefs.IsNotFound(err) && !errors.Is(err, seaweed.ErrNotFound):
		return volumes.FileInfo{}, fmt.Errorf("writing %s in volume %s: %w", p, v.ID, err)
	}
	qr := &quotaReader{r: r, left: math.MaxInt64}
	if v.QuotaBytes > 0 {
		u, err := d.filer.Usage(ctx, Dir(v))
		if err != nil {
			return volumes.FileInfo{}, fmt.Errorf("writing %s in volume %s: usage: %w", p, v.ID, err)
		}
		qr.left = v.QuotaBytes - int64(u.Bytes) + int64(replaced)
	}
	tmp := path.Join(path.Dir(full), fmt.Sprintf(".%s.l9tmp-%d", path.Base(full), time.Now().UnixNano()))
	fail := func(err error) (volumes.FileInfo, error) {
		// The caller's context may be what ended the upload.
		if derr := d.filer.Delete(context.WithoutCancel(ctx), tmp); derr != nil {
			d.cfg.Logger.Error("removing a failed upload's temporary file", "volume_id", v.ID, "path", tmp, "err", derr)
		}
		if qr.full {
			return volumes.FileInfo{}, fmt.Errorf("writing %s in volume %s: %w", p, v.ID, volumes.ErrFull)
		}
		return volumes.FileInfo{}, fmt.Errorf("writing %s in volume %s: %w", p, v.ID, err)
	}
	if qr.left < 0 {
		qr.full = true
		return fail(volumes.ErrFull)
	}
	if err := d.filer.PutIn(ctx, tmp, Collection(v), qr); err != nil {
		return fail(err)
	}
	if qr.full {
		return fail(volumes.ErrFull)
	}
	if err := d.filer.Rename(ctx, tmp, full); err != nil {
		return fail(err)
	}
	e, err := d.stat(ctx, v, p)
	if err != nil {
		return volumes.FileInfo{}, fmt.Errorf("writing %s in volume %s: %w", p, v.ID, err)
	}
	return fileInfo(v, e), nil
}

// RemoveFile removes a file, or a directory tree with recursive set.
func (d *Driver) RemoveFile(ctx context.Context, v volumes.Volume, p string, recursive bool) error {
	if err := check(v); err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("removing the root of volume %s: delete the volume instead: %w", v.ID, errdefs.ErrInvalidArgument)
	}
	e, err := d.stat(ctx, v, p)
	if err != nil {
		return fmt.Errorf("removing %s in volume %s: %w", p, v.ID, err)
	}
	if e.IsDir() && !recursive {
		return fmt.Errorf("removing %s in volume %s: is a directory (use -r): %w", p, v.ID, errdefs.ErrInvalidArgument)
	}
	if err := d.filer.Delete(ctx, path.Join(Dir(v), p)); err != nil {
		return fmt.Errorf("removing %s in volume %s: %w", p, v.ID, err)
	}
	return nil
}
