package sandbox

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// dirWatch wakes a container's watcher when a file in its directory is
// created or written (inotify), so output reaches its writer as it is
// written rather than at the next poll. One inotify instance serves every
// container of a runtime: an instance each would use up the per-user limit
// (128 by default) that kubelet and systemd need too. The instance lives
// while some directory is watched.
type dirWatch struct {
	// mu guards the fields below.
	mu sync.Mutex
	f  *os.File
	// fd is f's descriptor, kept because f.Fd() would make f blocking
	// and Close could no longer end a Read.
	fd    int
	wakes map[int32]chan struct{}
}

// minPass spaces the passes a busy writer's stream of signals causes: a
// task that prints without pause costs at most one pass per minPass.
const minPass = 2 * time.Millisecond

// add watches dir: the channel holds at most one signal (writes coalesce);
// stop ends the watch.
func (w *dirWatch) add(dir string) (wake <-chan struct{}, stop func(), err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if err != nil {
			return nil, nil, fmt.Errorf("inotify: %w", err)
		}
		// Non-blocking, so the runtime's poller reads it and Close ends a
		// Read in progress.
		w.f, w.fd, w.wakes = os.NewFile(uintptr(fd), "inotify"), fd, map[int32]chan struct{}{}
		go w.run(w.f)
	}
	wd, err := unix.InotifyAddWatch(w.fd, dir, unix.IN_CREATE|unix.IN_MODIFY|unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO)
	if err != nil {
		w.closeIfIdleLocked()
		return nil, nil, fmt.Errorf("inotify watch %s: %w", dir, err)
	}
	ch := make(chan struct{}, 1)
	w.wakes[int32(wd)] = ch
	f := w.f
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.f != f || w.wakes[int32(wd)] != ch {
			return
		}
		delete(w.wakes, int32(wd))
		// EINVAL when the directory went first (the kernel dropped it).
		_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
		w.closeIfIdleLocked()
	}, nil
}

func (w *dirWatch) closeIfIdleLocked() {
	if len(w.wakes) == 0 && w.f != nil {
		_ = w.f.Close()
		w.f, w.wakes = nil, nil
	}
}

// run reads f's events until f is closed and signals their directories.
func (w *dirWatch) run(f *os.File) {
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		w.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			off += unix.SizeofInotifyEvent + nameLen
			if ch, ok := w.wakes[wd]; ok && w.f == f {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
		w.mu.Unlock()
	}
}
