package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// lockPollInterval is how often a blocked flock is retried; flock has no
// context-aware blocking form.
const lockPollInterval = 20 * time.Millisecond

// fileLock is a held flock(2) on a lock file. flock locks belong to the open
// file description, so two Stores in one process exclude each other too.
type fileLock struct{ f *os.File }

func (l *fileLock) unlock() {
	if l == nil || l.f == nil {
		return
	}
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	_ = l.f.Close()
	l.f = nil
}

// lockPath takes how (LOCK_EX or LOCK_SH) on path, waiting until ctx ends.
func lockPath(ctx context.Context, path string, how int) (*fileLock, error) {
	for {
		l, ok, err := tryLockPath(path, how)
		if err != nil || ok {
			return l, err
		}
		t := time.NewTimer(lockPollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-t.C:
		}
	}
}

// tryLockPath takes the lock without waiting; ok=false when it is held.
func tryLockPath(path string, how int) (*fileLock, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("flock %s: %w", path, err)
	}
	return &fileLock{f: f}, true, nil
}
