package devstack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Registry is a private docker-registry (Debian's, the CNCF Distribution
// registry) serving plain HTTP on a local address, detached from the
// caller, with its pid in Dir/registry.pid.
type Registry struct {
	Dir  string
	Host string // listen address; 127.0.0.1 when empty
	Port int
}

// StartRegistry starts docker-registry on host:port (127.0.0.1 and a free
// port when empty and 0) with its storage under dir and returns once it
// answers. host must be an address of this machine: plain HTTP never
// leaves it.
func StartRegistry(ctx context.Context, dir, host string, port int) (*Registry, error) {
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		return nil, fmt.Errorf("docker-registry not found (install the docker-registry package): %w", err)
	}
	if port == 0 {
		if port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "storage"), 0o700); err != nil {
		return nil, err
	}
	r := &Registry{Dir: dir, Host: host, Port: port}
	cmd, err := RegistryCommand(bin, dir, filepath.Join(dir, "storage"), r.Addr(), "")
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "registry.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start docker-registry: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "registry.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return nil, err
	}
	go func() { _ = cmd.Wait() }()
	if err := waitTCP(ctx, r.Addr(), 15*time.Second); err != nil {
		_ = r.Stop()
		return nil, fmt.Errorf("docker-registry (log: %s): %w", filepath.Join(dir, "registry.log"), err)
	}
	return r, nil
}

// RegistryCommand writes dir/config.yml for the docker-registry binary bin,
// storing under storage, serving plain HTTP on addr (an address of this
// machine), with extra appended to the configuration (an auth: section, or
// ""), and returns the command that serves it, not yet started: the caller
// sets its output and process attributes (detached for the dev stack, dying
// with the test binary for tests).
func RegistryCommand(bin, dir, storage, addr, extra string) (*exec.Cmd, error) {
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
%s`, storage, addr, extra)
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	return exec.Command(bin, "serve", cfgPath), nil
}

// Addr is HOST:PORT.
func (r *Registry) Addr() string {
	h := r.Host
	if h == "" {
		h = "127.0.0.1"
	}
	return net.JoinHostPort(h, strconv.Itoa(r.Port))
}

// Stop ends the registry named by Dir/registry.pid.
func (r *Registry) Stop() error {
	pidFile := filepath.Join(r.Dir, "registry.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return fmt.Errorf("registry: %w", errNotRunning)
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		return fmt.Errorf("registry pid file: %w", err)
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return os.Remove(pidFile)
}
