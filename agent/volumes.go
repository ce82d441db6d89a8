package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/levers9/levers9/agent/taskrun"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/volumes"
	"github.com/levers9/levers9/volumes/seaweedfs"
)

// volumeMounter mounts task volumes on this node under Root, one FUSE
// mount per volume and mode shared by the attempts that use it, unmounted
// when the last of them ends. Safe for concurrent use.
type volumeMounter struct {
	// Root holds the mounts (Root/VOLUME_ID-rw, Root/VOLUME_ID-ro) and
	// their state.
	Root string
	// WeedPath is the weed binary for seaweedfs volumes.
	WeedPath string
	Logger   *slog.Logger

	// mu guards the fields below.
	mu sync.Mutex
	// drivers are the seaweedfs drivers by filer address.
	drivers map[string]*seaweedfs.Driver
	// users counts the attempts holding each target.
	users map[string]int
}

var _ taskrun.VolumeMounter = (*volumeMounter)(nil)

func newVolumeMounter(root, weed string, log *slog.Logger) *volumeMounter {
	return &volumeMounter{Root: root, WeedPath: weed, Logger: log, drivers: map[string]*seaweedfs.Driver{}, users: map[string]int{}}
}

func (m *volumeMounter) target(v taskrun.Volume) string {
	mode := "rw"
	if v.ReadOnly {
		mode = "ro"
	}
	return filepath.Join(m.Root, "mnt", v.ID+"-"+mode)
}

// stateDir holds the mounts' logs, caches and credentials.
func (m *volumeMounter) stateDir() string { return filepath.Join(m.Root, "state") }

// driverLocked returns the driver for v, made on first use.
func (m *volumeMounter) driverLocked(v taskrun.Volume) (*seaweedfs.Driver, error) {
	if v.Driver != seaweedfs.DriverName {
		return nil, fmt.Errorf("volume %s: driver %q cannot mount on this machine: %w", v.Name, v.Driver, errdefs.ErrFailedPrecondition)
	}
	if m.WeedPath == "" {
		return nil, fmt.Errorf("volume %s: no weed binary on this machine (levers9-agent --weed): %w", v.Name, errdefs.ErrFailedPrecondition)
	}
	d := m.drivers[v.FilerAddr]
	if d == nil {
		// Credentials come per push (MountOptions.Env), not per driver.
		d = seaweedfs.New(seaweedfs.Config{Bin: m.WeedPath, FilerAddr: v.FilerAddr, FilerURL: v.FilerURL,
			StateDir: m.stateDir(), Logger: m.Logger})
		m.drivers[v.FilerAddr] = d
	}
	return d, nil
}

// Acquire mounts v on first use and returns its host path.
func (m *volumeMounter) Acquire(ctx context.Context, v taskrun.Volume) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.target(v)
	if m.users[t] > 0 {
		m.users[t]++
		return t, nil
	}
	d, err := m.driverLocked(v)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(t), 0o700); err != nil {
		return "", fmt.Errorf("volume %s: %w", v.Name, err)
	}
	// Serialised under mu: mounts are rare and each waits for the kernel.
	// The mount process gets the credentials of the attempt that mounted
	// it first, as 0600 files in its state directory (never argv).
	if err := d.Mount(ctx, v.Volume, t, volumes.MountOptions{ReadOnly: v.ReadOnly, Env: v.Env}); err != nil {
		return "", err
	}
	m.users[t] = 1
	m.Logger.Info("volume mounted", "volume_id", v.ID, "target", t, "read_only", v.ReadOnly)
	return t, nil
}

// Release unmounts v when its last attempt let go.
func (m *volumeMounter) Release(ctx context.Context, v taskrun.Volume) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.target(v)
	if m.users[t] == 0 {
		return nil
	}
	m.users[t]--
	if m.users[t] > 0 {
		return nil
	}
	delete(m.users, t)
	d := m.drivers[v.FilerAddr]
	if d == nil {
		return nil
	}
	if err := d.Unmount(ctx, t); err != nil {
		return err
	}
	m.Logger.Info("volume unmounted", "volume_id", v.ID, "target", t)
	return nil
}

// Reconcile unmounts what an earlier agent left under Root (its mount
// processes died with it, leaving dead FUSE endpoints).
func (m *volumeMounter) Reconcile(ctx context.Context) error {
	left, err := seaweedfs.New(seaweedfs.Config{StateDir: m.stateDir()}).UnmountAll(ctx, m.Root)
	if len(left) > 0 {
		m.Logger.Info("unmounted volumes an earlier agent left", "targets", left)
	}
	return err
}

// UnmountAll unmounts every volume (the agent's shutdown, when no task
// runs any more).
func (m *volumeMounter) UnmountAll(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.users = map[string]int{}
	_, err := seaweedfs.New(seaweedfs.Config{StateDir: m.stateDir()}).UnmountAll(ctx, m.Root)
	for _, d := range m.drivers {
		if _, derr := d.UnmountAll(ctx, m.Root); derr != nil && err == nil {
			err = derr
		}
	}
	return err
}
