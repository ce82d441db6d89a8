// Package juicefs is the volumes driver for JuiceFS, the documented one,
// for nodes that have the `juicefs` binary: one JuiceFS filesystem per
// workspace (metadata in the workspace's Postgres or Redis, data in its
// object store), each volume a directory of it with a directory quota,
// mounted with `juicefs mount --subdir`.
//
// What it guarantees, and what its tests check: the metadata URL reaches
// juicefs without its password (the password goes in META_PASSWORD) and
// the object store's keys in ACCESS_KEY and SECRET_KEY, all in the
// process's environment, never in argv. It was never run against a real
// juicefs here: the JuiceFS module and its forks are refused by the module
// proxy and no Debian package ships it (see the README's Volumes section).
// Its API is internal to levers9 and may change.
package juicefs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/volumes"
)

// DriverName is how volumes record this driver.
const DriverName = "juicefs"

// Config is a workspace's JuiceFS: where its metadata and data live and
// the credentials to reach them.
type Config struct {
	// Bin is the juicefs binary; "juicefs" on PATH when empty.
	Bin string
	// MetaURL is the metadata engine's URL (postgres://user:pass@host/db,
	// redis://:pass@host/1). Its password is taken out before use.
	MetaURL string
	// Storage, Bucket, AccessKey, SecretKey are the object store (juicefs
	// format --storage --bucket; the keys go in the environment).
	Storage   string
	Bucket    string
	AccessKey string
	SecretKey string
	// FSName is the JuiceFS filesystem's name (one per workspace).
	FSName string
	// CacheDir is the node's cache for mounts.
	CacheDir string
}

// Cmd is a command to run: argv (after the binary) and the extra
// environment, where every secret is.
type Cmd struct {
	Args []string
	Env  []string
}

// Driver implements volumes.Driver with the juicefs binary.
type Driver struct {
	cfg Config

	// mu guards mounts.
	mu     sync.Mutex
	mounts map[string]*exec.Cmd
}

var _ volumes.Driver = (*Driver)(nil)

// New returns a driver for cfg.
func New(cfg Config) *Driver { return &Driver{cfg: cfg, mounts: map[string]*exec.Cmd{}} }

// Name is "juicefs".
func (d *Driver) Name() string { return DriverName }

// splitMeta returns the metadata URL without its password, and the
// password (empty when there is none).
func splitMeta(raw string) (string, string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		// Never echo the URL: it may hold the password.
		return "", "", fmt.Errorf("juicefs metadata URL: not a URL: %w", errdefs.ErrInvalidArgument)
	}
	pw, _ := u.User.Password()
	if u.User != nil {
		if name := u.User.Username(); name != "" {
			u.User = url.User(name)
		} else {
			u.User = nil
		}
	}
	return u.String(), pw, nil
}

func (d *Driver) secretEnv() ([]string, string, error) {
	meta, pw, err := splitMeta(d.cfg.MetaURL)
	if err != nil {
		return nil, "", err
	}
	var env []string
	if pw != "" {
		env = append(env, "META_PASSWORD="+pw)
	}
	if d.cfg.AccessKey != "" {
		env = append(env, "ACCESS_KEY="+d.cfg.AccessKey)
	}
	if d.cfg.SecretKey != "" {
		env = append(env, "SECRET_KEY="+d.cfg.SecretKey)
	}
	return env, meta, nil
}

var idRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,100}$`)

// subdir is the volume's directory in the workspace's filesystem.
func subdir(v volumes.Volume) (string, error) {
	if !idRE.MatchString(v.ID) {
		return "", fmt.Errorf("volume id %q: want 1-100 of [a-zA-Z0-9_-]: %w", v.ID, errdefs.ErrInvalidArgument)
	}
	return "/" + v.ID, nil
}

// FormatCmd formats the workspace's filesystem (--no-update: an existing
// one is left as it is, so this is idempotent).
func (d *Driver) FormatCmd() (Cmd, error) {
	env, meta, err := d.secretEnv()
	if err != nil {
		return Cmd{}, err
	}
	args := []string{"format", "--no-update"}
	if d.cfg.Storage != "" {
		args = append(args, "--storage", d.cfg.Storage)
	}
	if d.cfg.Bucket != "" {
		args = append(args, "--bucket", d.cfg.Bucket)
	}
	return Cmd{Args: append(args, meta, d.cfg.FSName), Env: env}, nil
}

// QuotaCmd sets the volume directory's capacity (juicefs counts whole GiB;
// rounded up so a quota is never smaller than asked).
func (d *Driver) QuotaCmd(v volumes.Volume) (Cmd, error) {
	env, meta, err := d.secretEnv()
	if err != nil {
		return Cmd{}, err
	}
	dir, err := subdir(v)
	if err != nil {
		return Cmd{}, err
	}
	gib := (v.QuotaBytes + (1 << 30) - 1) >> 30
	return Cmd{Args: []string{"quota", "set", meta, "--path", dir, "--capacity", strconv.FormatInt(gib, 10)}, Env: env}, nil
}

// MountCmd mounts the volume's directory at target in the foreground (the
// driver supervises it).
func (d *Driver) MountCmd(v volumes.Volume, target string, opts volumes.MountOptions) (Cmd, error) {
	env, meta, err := d.secretEnv()
	if err != nil {
		return Cmd{}, err
	}
	dir, err := subdir(v)
	if err != nil {
		return Cmd{}, err
	}
	args := []string{"mount", "--subdir", dir, "--no-usage-report"}
	if d.cfg.CacheDir != "" {
		args = append(args, "--cache-dir", d.cfg.CacheDir)
	}
	if opts.ReadOnly {
		args = append(args, "--read-only")
	}
	return Cmd{Args: append(args, meta, target), Env: env}, nil
}

// RmrCmd removes the volume's directory (juicefs rmr, through a mount of
// the filesystem's root at mountpoint).
func (d *Driver) RmrCmd(v volumes.Volume, mountpoint string) (Cmd, error) {
	dir, err := subdir(v)
	if err != nil {
		return Cmd{}, err
	}
	return Cmd{Args: []string{"rmr", path.Join(mountpoint, dir)}}, nil
}

func (d *Driver) bin() (string, error) {
	b := d.cfg.Bin
	if b == "" {
		b = "juicefs"
	}
	p, err := exec.LookPath(b)
	if err != nil {
		return "", fmt.Errorf("juicefs binary %q: %w: %w", b, err, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

func (d *Driver) run(ctx context.Context, what string, c Cmd) error {
	bin, err := d.bin()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, c.Args...)
	cmd.Env = append(os.Environ(), c.Env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		// juicefs prints the URL it was given, which holds no password.
		return fmt.Errorf("juicefs %s: %w: %s", what, err, strings.TrimSpace(lastBytes(out.String(), 800)))
	}
	return nil
}

// Create formats the workspace's filesystem if needed, makes the volume's
// directory through a short mount of the root, and sets its quota.
func (d *Driver) Create(ctx context.Context, v volumes.Volume) error {
	f, err := d.FormatCmd()
	if err != nil {
		return err
	}
	if err := d.run(ctx, "format", f); err != nil {
		return err
	}
	root, err := os.MkdirTemp("", "l9jfs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	if err := d.Mount(ctx, volumes.Volume{ID: "", Workspace: v.Workspace}, root, volumes.MountOptions{}); err != nil {
		return err
	}
	dir, _ := subdir(v)
	mkErr := os.MkdirAll(filepath.Join(root, dir), 0o777)
	_ = d.Unmount(ctx, root)
	if mkErr != nil {
		return fmt.Errorf("creating volume %s: %w", v.ID, mkErr)
	}
	if v.QuotaBytes > 0 {
		q, err := d.QuotaCmd(v)
		if err != nil {
			return err
		}
		return d.run(ctx, "quota set", q)
	}
	return nil
}

// Delete is not implemented for JuiceFS here: it needs a root mount and
// `juicefs rmr`, which could not be run on these machines.
func (d *Driver) Delete(ctx context.Context, v volumes.Volume) error {
	return fmt.Errorf("deleting juicefs volume %s: not supported by this driver yet: %w", v.ID, errdefs.ErrFailedPrecondition)
}

// Stats is not implemented for JuiceFS here (juicefs summary would do).
func (d *Driver) Stats(ctx context.Context, v volumes.Volume) (volumes.Stats, error) {
	return volumes.Stats{}, fmt.Errorf("stats of juicefs volume %s: not supported by this driver yet: %w", v.ID, errdefs.ErrFailedPrecondition)
}

// Mount starts juicefs mount in the foreground and waits for the mount.
// An empty v.ID mounts the filesystem's root (Create uses it).
func (d *Driver) Mount(ctx context.Context, v volumes.Volume, target string, opts volumes.MountOptions) error {
	var c Cmd
	var err error
	if v.ID == "" {
		var env []string
		var meta string
		if env, meta, err = d.secretEnv(); err == nil {
			c = Cmd{Args: []string{"mount", "--no-usage-report", meta, target}, Env: env}
		}
	} else {
		c, err = d.MountCmd(v, target, opts)
	}
	if err != nil {
		return err
	}
	bin, err := d.bin()
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, c.Args...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("mounting juicefs volume %s: %w", v.ID, err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m, ok, _ := volumes.MountedAt(target); ok && strings.HasPrefix(m.FSType, "fuse") {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("mounting juicefs volume %s at %s: not mounted within 60s", v.ID, target)
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.mu.Lock()
	d.mounts[filepath.Clean(target)] = cmd
	d.mu.Unlock()
	return nil
}

// Unmount runs juicefs umount and reaps the mount process.
func (d *Driver) Unmount(ctx context.Context, target string) error {
	target = filepath.Clean(target)
	d.mu.Lock()
	cmd := d.mounts[target]
	delete(d.mounts, target)
	d.mu.Unlock()
	err := d.run(ctx, "umount", Cmd{Args: []string{"umount", target}})
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	if m, ok, _ := volumes.MountedAt(target); ok && strings.HasPrefix(m.FSType, "fuse") {
		return errors.Join(err, fmt.Errorf("unmounting %s: still mounted", target))
	}
	return nil
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
