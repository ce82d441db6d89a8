package taskrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
)

// IOPath is where a container finds its io directory: the task's input
// as the file input (read-only), and the file result it may write.
const IOPath = "/run/levers9/io"

// MaxInputBytes bounds Task.Input (the controlplane refuses more at
// submit); DefaultMaxResultBytes is Config.MaxResultBytes when unset.
const (
	MaxInputBytes         = 1 << 20
	DefaultMaxResultBytes = 8 << 20
)

// The files of an io directory.
const (
	inputFile  = "input"
	resultFile = "result"
)

// ResultFile is what an attempt left in IOPath/result once its container
// exited.
type ResultFile struct {
	// Present is true when a regular file within the limit was there;
	// Data is its content (possibly empty).
	Present bool
	Data    []byte
	// Err says why something that was written is not in Data: larger than
	// the limit, or not a regular file. Present is false then.
	Err string
}

// ioHook gives every attempt of a task (not a build step) a directory of
// its own under Config.IODir, bound at IOPath: the input is written there
// (0444, owned by the agent), and the directory is owned by the task's user
// so a non-root task can write its result. Once the container has exited
// the result is read without trusting the directory: the container owned
// it, so a symbolic link (to a host file), a FIFO (that would block the
// agent) or a device is refused, and no more than the limit plus one byte
// is read. Stop removes the directory. The path is the attempt's run ID
// under IODir, so an agent that restarted while the container ran finds
// the result there (Resume), and Reconcile and Recover remove directories
// of attempts they drop.
type ioHook struct {
	// dir is the attempt's directory; "" when the Runner has no IODir.
	dir   string
	limit int

	// mu guards the fields below, which make Prestart and Exited
	// idempotent.
	mu     sync.Mutex
	made   bool
	result *ResultFile
}

var (
	_ Prestarter = (*ioHook)(nil)
	_ Exiter     = (*ioHook)(nil)
	_ Stopper    = (*ioHook)(nil)
)

func newIOHook(ioDir string, t Task, limit int) *ioHook {
	h := &ioHook{limit: limit}
	if ioDir != "" {
		h.dir = filepath.Join(ioDir, t.runID())
	}
	return h
}

func (h *ioHook) Name() string { return "io" }

// applies says whether the attempt gets an io directory: every task
// attempt on a Runner with an IODir, no build step (its rootfs changes
// are the image).
func (h *ioHook) applies(t Task) bool { return h.dir != "" && t.Build == nil }

func (h *ioHook) Prestart(_ context.Context, req *PrestartRequest, resp *PrestartResponse) error {
	t := req.Task
	if len(t.Input) > MaxInputBytes {
		return errdefs.WithRetry(fmt.Errorf("task input: %d bytes, more than %d: %w", len(t.Input), MaxInputBytes, errdefs.ErrInvalidArgument), false)
	}
	if !h.applies(t) {
		if len(t.Input) > 0 {
			return errdefs.WithRetry(fmt.Errorf("task input: this agent has no io directory for %s: %w", IOPath, errdefs.ErrFailedPrecondition), false)
		}
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.made {
		if err := h.make(req); err != nil {
			_ = os.RemoveAll(h.dir)
			if errdefs.IsInvalidArgument(err) {
				return err
			}
			return withReason(ReasonMountFailed, "the task's io directory could not be made on this machine", err)
		}
		h.made = true
	}
	resp.Mounts = append(resp.Mounts, sandbox.Mount{Source: h.dir, Destination: IOPath, NoExec: true})
	return nil
}

// make creates the directory afresh (a leftover of a killed agent goes),
// writes the input and hands the directory to the task's user.
func (h *ioHook) make(req *PrestartRequest) error {
	user := req.Task.User
	if user == "" && req.Image != nil {
		user = req.Image.Config.User
	}
	uid, gid, err := sandbox.ResolveUser(req.Rootfs, user)
	if err != nil {
		return errdefs.WithRetry(fmt.Errorf("io directory: task user %q: %w: %w", user, err, errdefs.ErrInvalidArgument), false)
	}
	if err := os.MkdirAll(filepath.Dir(h.dir), 0o700); err != nil {
		return fmt.Errorf("io directory: %w", err)
	}
	if err := os.RemoveAll(h.dir); err != nil {
		return fmt.Errorf("io directory: remove a leftover: %w", err)
	}
	if err := os.Mkdir(h.dir, 0o700); err != nil {
		return fmt.Errorf("io directory: %w", err)
	}
	if len(req.Task.Input) > 0 {
		if err := writeInput(filepath.Join(h.dir, inputFile), req.Task.Input); err != nil {
			return fmt.Errorf("io directory: write the input: %w", err)
		}
	}
	// The owner is the task's user, never the agent: a non-root task can
	// write its result, and nothing else of the host is its.
	if err := os.Chown(h.dir, int(uid), int(gid)); err != nil {
		return fmt.Errorf("io directory: %w", err)
	}
	return nil
}

func writeInput(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(0o444) // whatever the umask was
	}
	return errors.Join(err, f.Close())
}

// Exited reads the result while the directory is still there (Stop
// removes it). A second call returns the first one's.
func (h *ioHook) Exited(_ context.Context, req *ExitedRequest, resp *ExitedResponse) error {
	if !h.applies(req.Task) {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.result == nil {
		r := readResult(h.dir, h.limit)
		h.result = &r
	}
	resp.Result = h.result
	return nil
}

// readResult reads dir/result as a file the container controlled: the
// final component is never followed, a FIFO does not block the open, and
// only a regular file of at most limit bytes is taken.
func readResult(dir string, limit int) ResultFile {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return ResultFile{}
	}
	if err != nil {
		return ResultFile{Err: fmt.Sprintf("the io directory could not be opened: %v", err)}
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, resultFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return ResultFile{}
	case errors.Is(err, unix.ELOOP):
		return ResultFile{Err: "the result is a symbolic link; it must be a regular file"}
	case err != nil:
		return ResultFile{Err: fmt.Sprintf("the result could not be opened: %v", err)}
	}
	f := os.NewFile(uintptr(fd), resultFile)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return ResultFile{Err: fmt.Sprintf("the result could not be read: %v", err)}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return ResultFile{Err: fmt.Sprintf("the result is a %s; it must be a regular file", fileKind(st.Mode))}
	}
	if st.Size > int64(limit) {
		return ResultFile{Err: tooLarge(st.Size, limit)}
	}
	// The size may change under us (nothing of the container should run
	// any more, but the file is not ours): read one byte past the limit.
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return ResultFile{Err: fmt.Sprintf("the result could not be read: %v", err)}
	}
	if len(b) > limit {
		return ResultFile{Err: tooLarge(int64(len(b)), limit)}
	}
	return ResultFile{Present: true, Data: b}
}

func tooLarge(n int64, limit int) string {
	return fmt.Sprintf("the result is %d bytes; the limit is %s", n, bytesText(int64(limit)))
}

func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "device"
	}
	return "special file"
}

func (h *ioHook) Stop(context.Context, *StopRequest) error {
	if h.dir == "" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := os.RemoveAll(h.dir); err != nil {
		return fmt.Errorf("remove io directory: %w", err)
	}
	h.made = false
	return nil
}

// removeIODirs removes the io directories of attempts not in keep (run
// IDs); an agent's Reconcile and Recover call it once what ran there is
// gone.
func removeIODirs(ioDir string, keep map[string]bool) error {
	if ioDir == "" {
		return nil
	}
	ents, err := os.ReadDir(ioDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list io directories: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if keep[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(ioDir, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("remove io directory: %w", err))
		}
	}
	return errors.Join(errs...)
}
