package seaweed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Process is one supervised weed process: started by Start, restarted with
// backoff when it exits on its own, stopped by Stop. Its stdout and stderr
// append to LogPath. Env is added to the process's environment (where
// secrets go; argv is visible to every user in /proc/PID/cmdline).
type Process struct {
	Name    string
	Bin     string
	Args    []string
	Env     []string
	Dir     string
	LogPath string
	Logger  *slog.Logger
	// Restart says whether an exit is followed by a restart (servers and
	// mounts) or just recorded.
	Restart bool

	// mu guards the fields below it.
	mu       sync.Mutex
	cmd      *exec.Cmd
	restarts int
	stopping bool
	started  bool
	done     chan struct{} // closed when the supervising goroutine ends
	stop     chan struct{} // closed by Stop
}

const (
	restartMin = 200 * time.Millisecond
	restartMax = 10 * time.Second
	// stopGrace is how long a process has to exit after SIGTERM (a mount
	// unmounts itself on SIGTERM) before it is killed.
	stopGrace = 10 * time.Second
)

// Start starts the process and returns once it runs; a supervising
// goroutine restarts it until Stop. Starting twice is an error.
func (p *Process) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return fmt.Errorf("starting %s: already started", p.Name)
	}
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	cmd, err := p.spawnLocked()
	if err != nil {
		return err
	}
	p.started = true
	p.done = make(chan struct{})
	p.stop = make(chan struct{})
	go p.supervise(cmd)
	return nil
}

func (p *Process) spawnLocked() (*exec.Cmd, error) {
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("starting %s: opening its log: %w", p.Name, err)
	}
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Dir = p.Dir
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	// Its own process group, so a terminal's ^C reaches the supervisor
	// first and the mount is unmounted in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", p.Name, p.Bin, err)
	}
	logf.Close() // the child holds its own copy
	p.cmd = cmd
	return cmd, nil
}

func (p *Process) supervise(cmd *exec.Cmd) {
	defer close(p.done)
	backoff := restartMin
	for {
		began := time.Now()
		err := cmd.Wait()
		p.mu.Lock()
		stopping := p.stopping
		p.mu.Unlock()
		if stopping || !p.Restart {
			if !stopping {
				p.Logger.Warn("process exited", "process", p.Name, "err", err, "log", p.LogPath)
			}
			return
		}
		if time.Since(began) > time.Minute {
			backoff = restartMin // it ran a good while: not a crash loop
		}
		p.Logger.Warn("process exited; restarting", "process", p.Name, "err", err, "in", backoff, "log", p.LogPath)
		select {
		case <-p.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, restartMax)
		p.mu.Lock()
		if p.stopping {
			p.mu.Unlock()
			return
		}
		next, err := p.spawnLocked()
		if err == nil {
			p.restarts++
		}
		p.mu.Unlock()
		if err != nil {
			p.Logger.Error("restarting process", "process", p.Name, "err", err)
			return
		}
		cmd = next
	}
}

// Restarts is how many times the supervisor restarted the process.
func (p *Process) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// PID is the running process's id, or 0.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Done is closed once the process has exited for good (stopped, or exited
// with Restart false).
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Stop sends SIGTERM, kills after a grace period, and blocks until the
// supervisor has ended. Safe twice and before Start.
func (p *Process) Stop() error {
	p.mu.Lock()
	if !p.started {
		p.mu.Unlock()
		return nil
	}
	if !p.stopping {
		p.stopping = true
		close(p.stop)
	}
	cmd := p.cmd
	done := p.done
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-done:
		return nil
	case <-time.After(stopGrace):
	}
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
	select {
	case <-done:
		return fmt.Errorf("stopping %s: killed after %s without exiting on SIGTERM", p.Name, stopGrace)
	case <-time.After(5 * time.Second):
		return errors.New("stopping " + p.Name + ": still running after SIGKILL")
	}
}
