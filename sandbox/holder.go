package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// holderScript is the holder: it waits for its container directory on
// stdin, reads the runtime's command line from the directory's "args" file
// (one argument per line), runs it with the container's output in the
// files "stdout" and "stderr" there, and writes its exit status to "exit".
// Only shell builtins run before the runtime, so the runtime is the one
// process started on a container's path. It takes no secret (the
// environment is in the bundle).
//
// The status is written in place, one write of digits and a newline (no
// temporary file and `mv`, a second process at every exit): a reader takes
// the file only once that newline is there. A holder whose stdin closes
// before it got a directory (its agent went away) exits.
const holderScript = `IFS= read -r dir || exit 0
cd "$dir" || exit 1
set --
while IFS= read -r a; do set -- "$@" "$a"; done <` + argsFile + `
"$@" </dev/null >>` + stdoutFile + ` 2>>` + stderrFile + `
echo $? >` + exitFile

// argsFile holds the runtime's command line for the holder.
const argsFile = "args"

// holder is a started holder process waiting for its container.
type holder struct {
	cmd *exec.Cmd
	// in is the write end of its stdin.
	in *os.File
}

// holders keeps one holder started ahead of the container that needs it:
// starting a process costs 2 to 3 ms on a small VM, and a shell that then
// starts the runtime would cost it twice on every container's start.
type holders struct {
	// mu guards the fields below but wg.
	mu     sync.Mutex
	spare  *holder
	closed bool
	// refilling is true while the next spare is on its way; timer starts
	// it.
	refilling bool
	timer     *time.Timer
	wg        sync.WaitGroup
}

// spawnHolder starts a holder in its own session (the container outlives
// this process), waiting for its directory.
func spawnHolder() (*holder, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("holder stdin: %w", err)
	}
	cmd := exec.Command("/bin/sh", "-c", holderScript, "holder")
	cmd.Stdin = r
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	_ = r.Close()
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("start holder: %w", err)
	}
	return &holder{cmd: cmd, in: w}, nil
}

// take returns the spare holder, or a new one when there is none.
func (hs *holders) take() (*holder, error) {
	hs.mu.Lock()
	h := hs.spare
	hs.spare = nil
	hs.mu.Unlock()
	if h != nil {
		return h, nil
	}
	return spawnHolder()
}

// fill has the next spare started in the background, fillDelay from now,
// unless one is there or on its way. Called once a container has started:
// a process started beside the runtime, or beside the task's first steps,
// would slow the very start it is meant to speed up.
func (hs *holders) fill() {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.closed || hs.refilling || hs.spare != nil {
		return
	}
	hs.refilling = true
	hs.wg.Add(1)
	hs.timer = time.AfterFunc(fillDelay, hs.refill)
}

// fillDelay is how long after a container's start the next spare holder
// is started.
const fillDelay = 20 * time.Millisecond

func (hs *holders) refill() {
	defer hs.wg.Done()
	h, err := spawnHolder()
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.refilling = false
	if err != nil {
		return // the next take starts its own
	}
	if hs.closed || hs.spare != nil {
		h.discard()
		return
	}
	hs.spare = h
}

// close ends the spare; holders taken before go on.
func (hs *holders) close() {
	hs.mu.Lock()
	hs.closed = true
	h := hs.spare
	hs.spare = nil
	if hs.timer != nil && hs.timer.Stop() {
		// It will not run: nothing else ends its count.
		hs.refilling = false
		hs.wg.Done()
	}
	hs.mu.Unlock()
	hs.wg.Wait()
	if h != nil {
		h.discard()
	}
}

// discard ends a holder that got no container: its stdin closes and it
// exits.
func (h *holder) discard() {
	_ = h.in.Close()
	_ = h.cmd.Wait()
}

// run hands the holder its container directory, whose args file it reads
// the runtime's command line from.
func (h *holder) run(dir string, argv []string) error {
	for _, a := range argv {
		if strings.Contains(a, "\n") {
			h.discard()
			return fmt.Errorf("runtime argument %q: has a newline: %w", a, errInvalidHolderArg)
		}
	}
	if strings.Contains(dir, "\n") {
		h.discard()
		return fmt.Errorf("container directory %q: has a newline: %w", dir, errInvalidHolderArg)
	}
	if err := os.WriteFile(filepath.Join(dir, argsFile), []byte(strings.Join(argv, "\n")+"\n"), 0o600); err != nil {
		h.discard()
		return err
	}
	_, err := h.in.WriteString(dir + "\n")
	if cerr := h.in.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// It died waiting (killed by hand): reap it.
		_ = h.cmd.Wait()
		return fmt.Errorf("hand the container to its holder: %w", err)
	}
	return nil
}

var errInvalidHolderArg = errors.New("the holder takes one argument per line")
