package sandbox

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// dirWaker signals when a file in a directory is created or written
// (inotify), so a container's output reaches its writer as it is written
// rather than at the next poll. It coalesces: C holds at most one signal.
type dirWaker struct {
	f *os.File
	C chan struct{}
}

// minPass spaces the passes a busy writer's stream of signals causes: a
// task that prints without pause costs at most one pass per minPass.
const minPass = 2 * time.Millisecond

func watchDir(dir string) (*dirWaker, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MODIFY|unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("inotify watch %s: %w", dir, err)
	}
	// Non-blocking, so the runtime's poller reads it and Close ends a
	// Read in progress.
	w := &dirWaker{f: os.NewFile(uintptr(fd), "inotify:"+dir), C: make(chan struct{}, 1)}
	go w.run()
	return w, nil
}

func (w *dirWaker) run() {
	buf := make([]byte, 4096)
	for {
		if _, err := w.f.Read(buf); err != nil {
			return
		}
		select {
		case w.C <- struct{}{}:
		default:
		}
	}
}

// Close stops the watch.
func (w *dirWaker) Close() { _ = w.f.Close() }
