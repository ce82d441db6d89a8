package devstack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RedisDatabases is how many numbered databases a private redis-server has
// (tests give each controlplane its own).
const RedisDatabases = 1024

// Redis is a private redis-server.
type Redis struct {
	Dir      string
	Port     int
	Password string
	bin      string
}

// StartRedis starts redis-server on a free port (or port) with its files in
// dir. An empty password runs without one. The config, password included,
// goes through a 0600 file, not argv.
func StartRedis(ctx context.Context, dir string, port int, password string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (install the redis-server package): %w", err)
	}
	if port == 0 {
		if port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	r := &Redis{Dir: dir, Port: port, Password: password, bin: bin}
	return r, r.StartServer(ctx)
}

// Addr is 127.0.0.1:PORT.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)) }

// StartServer (re)starts the server.
func (r *Redis) StartServer(ctx context.Context) error {
	conf := []string{
		"bind 127.0.0.1",
		"port " + strconv.Itoa(r.Port),
		"daemonize yes",
		"pidfile " + filepath.Join(r.Dir, "redis.pid"),
		"logfile " + filepath.Join(r.Dir, "redis.log"),
		"dir " + r.Dir,
		`save ""`,
		"appendonly no",
		"databases " + strconv.Itoa(RedisDatabases),
		"protected-mode yes",
	}
	if r.Password != "" {
		conf = append(conf, "requirepass "+r.Password)
	}
	cf := filepath.Join(r.Dir, "redis.conf")
	if err := os.WriteFile(cf, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	if err := run(exec.CommandContext(ctx, r.bin, cf), "redis-server"); err != nil {
		return err
	}
	if err := waitTCP(ctx, r.Addr(), 15*time.Second); err != nil {
		return err
	}
	// The daemon may answer before it writes its pid file, which Stop
	// needs; the file exists (empty) for a moment before the pid is in it.
	pid := filepath.Join(r.Dir, "redis.pid")
	for deadline := time.Now().Add(10 * time.Second); ; {
		if b, err := os.ReadFile(pid); err == nil {
			if _, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server answers but wrote no %s", pid)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// StopServer stops the server and waits until it is gone.
func (r *Redis) StopServer(ctx context.Context) error {
	b, err := os.ReadFile(filepath.Join(r.Dir, "redis.pid"))
	if err != nil {
		return fmt.Errorf("redis: %w", errNotRunning)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("redis pid file: %w", err)
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Stop stops the server.
func (r *Redis) Stop() error { return r.StopServer(context.Background()) }
