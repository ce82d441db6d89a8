package image

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
)

var taskIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Mount gives task taskID a writable root filesystem: an overlay of the
// image's read-only lower directory with an upper and work directory that
// belong to this task alone (tasks/<taskID>/). It returns the mounted path
// and a cleanup that unmounts and deletes the task's directories; cleanup is
// idempotent and safe to call concurrently. The image stays pinned (never
// garbage-collected) until cleanup. A second Mount for a live taskID fails
// with ErrAlreadyExists.
func (s *Store) Mount(ctx context.Context, digest, taskID string) (string, func() error, error) {
	hex, err := parseDigest(digest)
	if err != nil {
		return "", nil, err
	}
	if !taskIDRE.MatchString(taskID) || taskID == "." || taskID == ".." {
		return "", nil, fmt.Errorf("mount image %s: task ID %q must match %s: %w", digest, taskID, taskIDRE, errdefs.ErrInvalidArgument)
	}
	// A shared lock keeps another process's GC off this digest while we
	// mount; once mounted, mountinfo protects it.
	lock, err := lockPath(ctx, s.lockPath(hex), unix.LOCK_SH)
	if err != nil {
		return "", nil, fmt.Errorf("mount image %s for task %s: %w", digest, taskID, err)
	}
	defer lock.unlock()

	s.mu.Lock()
	if _, err := s.readRecord(hex); err != nil {
		s.mu.Unlock()
		return "", nil, fmt.Errorf("mount image %s for task %s: %w", digest, taskID, err)
	}
	s.mounts[hex]++
	s.mu.Unlock()
	unpin := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.mounts[hex]--; s.mounts[hex] <= 0 {
			delete(s.mounts, hex)
		}
	}
	s.touch(hex)

	dir := s.path("tasks", taskID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		unpin()
		if errors.Is(err, os.ErrExist) {
			return "", nil, fmt.Errorf("mount image %s for task %s: %w", digest, taskID, errdefs.ErrAlreadyExists)
		}
		return "", nil, fmt.Errorf("mount image %s for task %s: %w", digest, taskID, err)
	}
	upper, work, target := dir+"/upper", dir+"/work", dir+"/rootfs"
	for _, d := range []string{upper, work, target} {
		if err := os.Mkdir(d, 0o755); err != nil {
			unpin()
			_ = os.RemoveAll(dir)
			return "", nil, fmt.Errorf("mount image %s for task %s: %w", digest, taskID, err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", s.rootfsPath(hex), upper, work)
	if err := unix.Mount(s.cfg.MountSource, target, "overlay", 0, opts); err != nil {
		unpin()
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("mount image %s for task %s: overlay: %w", digest, taskID, err)
	}
	var once sync.Once
	var cerr error
	cleanup := func() error {
		once.Do(func() {
			cerr = s.removeTask(taskID)
			unpin()
		})
		return cerr
	}
	return target, cleanup, nil
}

// UpperDir is the overlay upper directory of a task's mount: what the
// task changed in the image (an image build captures it as a layer).
func (s *Store) UpperDir(taskID string) string { return s.path("tasks", taskID, "upper") }

// Unmount unmounts the rootfs Mount made for a task and deletes its
// directories, for a process that did not mount it itself (an agent that
// restarted while the task ran). Idempotent.
func (s *Store) Unmount(taskID string) error {
	if !taskIDRE.MatchString(taskID) || taskID == "." || taskID == ".." {
		return fmt.Errorf("unmount task %q: bad task ID: %w", taskID, errdefs.ErrInvalidArgument)
	}
	return s.removeTask(taskID)
}

// removeTask unmounts a task's rootfs (if mounted) and deletes its dirs.
func (s *Store) removeTask(taskID string) error {
	dir := s.path("tasks", taskID)
	target := dir + "/rootfs"
	err := unix.Unmount(target, 0)
	if errors.Is(err, unix.EBUSY) {
		// Something still holds it (a dying container's process); detach so
		// the upper can be deleted and the mount vanishes when released.
		err = unix.Unmount(target, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount rootfs of task %s: %w", taskID, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove dirs of task %s: %w", taskID, err)
	}
	return nil
}

// mountedLowers returns every overlay lower directory mounted in this mount
// namespace, so GC spares images mounted by another process or by an agent
// that restarted.
func mountedLowers() (map[string]bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		_, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields := strings.Fields(post)
		if len(fields) < 3 || fields[0] != "overlay" {
			continue
		}
		for _, opt := range strings.Split(fields[2], ",") {
			if v, ok := strings.CutPrefix(opt, "lowerdir="); ok {
				for _, l := range strings.Split(v, ":") {
					out[unescapeMountinfo(l)] = true
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return out, nil
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Reconcile removes what a killed process left: partial downloads and
// unpacks, and task mounts whose task is not in live (the agent passes the
// tasks it reattached to). Lower directories without a record are removed
// when no other process holds their lock. Call it at start-up, before
// pulling, and not while another process sharing Root is pulling (its
// partial downloads would go).
func (s *Store) Reconcile(ctx context.Context, live []string) error {
	var errs []error
	tmps, _ := os.ReadDir(s.path("tmp"))
	for _, e := range tmps {
		if err := os.RemoveAll(s.path("tmp", e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	tasks, _ := os.ReadDir(s.path("tasks"))
	for _, e := range tasks {
		if slices.Contains(live, e.Name()) {
			continue
		}
		if err := s.removeTask(e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	roots, _ := os.ReadDir(s.path("rootfs"))
	for _, e := range roots {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := os.Stat(s.recordPath(e.Name())); err == nil || !hexRE.MatchString(e.Name()) {
			continue
		}
		lock, ok, err := tryLockPath(s.lockPath(e.Name()), unix.LOCK_EX)
		if err != nil || !ok {
			continue
		}
		if _, err := os.Stat(s.recordPath(e.Name())); errors.Is(err, os.ErrNotExist) {
			if err := os.RemoveAll(s.rootfsPath(e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
		lock.unlock()
	}
	return errors.Join(errs...)
}
