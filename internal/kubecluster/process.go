package kubecluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/levers9/levers9/internal/procstat"
)

// proc is one running component.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // the exit status, set before done is closed
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// spawner starts processes from one goroutine locked to its OS thread. The
// kernel's parent-death signal fires when the thread that forked a child
// exits, not the process, and Go may retire threads; a thread that stays
// put until Stop makes Pdeathsig mean "the test process died".
type spawner struct {
	reqs chan func()
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan func())}
	go func() {
		// Never unlocked: when the channel closes the goroutine ends and the
		// runtime retires the thread, which kills whatever it started.
		runtime.LockOSThread()
		for f := range s.reqs {
			f()
		}
	}()
	return s
}

func (s *spawner) do(f func()) {
	done := make(chan struct{})
	s.reqs <- func() { f(); close(done) }
	<-done
}

func (s *spawner) close() { close(s.reqs) }

// start runs bin with args in its own process group, its output to
// logs/NAME.log. Detached components get their own session and no
// parent-death signal, so they outlive the process that started them.
func (c *Cluster) start(name string, args ...string) error {
	logPath := filepath.Join(c.dir, "logs", name+".log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening the %s log: %w", name, err)
	}
	defer logf.Close() // the child holds its own copy
	cmd := exec.Command(filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = componentEnv()
	if c.opts.Detached {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	if c.spawner != nil {
		c.spawner.do(func() { err = cmd.Start() })
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	c.procs = append(c.procs, p)
	if err := c.writePIDs(); err != nil {
		return err
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	c.log.Info("started", "component", name, "pid", cmd.Process.Pid)
	return nil
}

// componentEnv is the environment of the components: only what they need,
// and no proxy settings, since every address they use is loopback.
func componentEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// pidsFile lists "NAME PID" per component so StopDir can stop a detached
// cluster from another process.
const pidsFile = "pids"

func (c *Cluster) writePIDs() error {
	var b strings.Builder
	for _, p := range c.procs {
		fmt.Fprintf(&b, "%s %d\n", p.name, p.cmd.Process.Pid)
	}
	return writeFile(filepath.Join(c.dir, pidsFile), []byte(b.String()), 0o600)
}

// readPIDs reads the pids file of dir, keeping only processes that still run
// the binary of that name (a pid may have been reused since).
func readPIDs(dir string) (map[string]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, pidsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the cluster's pids: %w", err)
	}
	live := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		name, pidText, ok := strings.Cut(line, " ")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && filepath.Base(exe) == name {
			live[name] = pid
		}
	}
	return live, nil
}

// StopDir kills the components of the cluster whose directory is dir (one
// started with Options.Detached, maybe by another process) and waits until
// they are gone. Stopping a cluster that is not running is not an error.
func StopDir(dir string) error {
	pids, err := readPIDs(dir)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		_ = syscall.Kill(-pid, syscall.SIGKILL) // the component leads its own group
	}
	deadline := time.Now().Add(10 * time.Second)
	for name, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("stopping %s (pid %d): still running after SIGKILL", name, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// alive reports whether pid is a process that has not exited (a zombie
// waiting for its parent counts as gone).
func alive(pid int) bool {
	st, err := procstat.Read(pid)
	return err == nil && !st.Exited()
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return lastLines(string(data), n)
}
