package image

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
)

// ReadFile reads name (e.g. "/etc/passwd") from an image's lower directory
// or a task's mounted rootfs as the container would see it: every symlink
// resolves inside root (openat2 RESOLVE_IN_ROOT), so an absolute or climbing
// link can never reach a host file. Only regular files are read, at most
// limit bytes. The spec builder uses it to resolve the image's user.
func ReadFile(root, name string, limit int64) ([]byte, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read %s in %s: open root: %w", name, root, err)
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, name, &unix.OpenHow{
		// O_NONBLOCK so a FIFO cannot block the open; it is refused below.
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("read %s in %s: %w", name, root, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("read %s in %s: %w", name, root, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read %s in %s: %w", name, root, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("read %s in %s: not a regular file (%v): %w", name, root, st.Mode().Type(), errdefs.ErrInvalidArgument)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s in %s: %w", name, root, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("read %s in %s: larger than %d bytes: %w", name, root, limit, errdefs.ErrInvalidArgument)
	}
	return b, nil
}
