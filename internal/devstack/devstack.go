// Package devstack starts private Postgres, Redis and docker-registry servers
// from Debian's packages, each in its own data directory on a free
// 127.0.0.1 port (RegistryCommand is the one registry launcher, shared with
// sandbox/image/imagetest). Tests and the local stack (`make up`) use it;
// production never does. It never
// touches the system-wide clusters, and passwords reach the servers through
// files or stdin, never argv. Its API is internal and may change.
package devstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// FreePort finds a free TCP port on 127.0.0.1 (see freePorts).
func FreePort() (int, error) {
	p, err := freePorts("127.0.0.1", 1, false)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// FreeTCPUDPPort finds a port free for both TCP and UDP on 127.0.0.1 (the
// tunnel listens on both with one number).
func FreeTCPUDPPort() (int, error) {
	p, err := FreeTCPUDPPorts("127.0.0.1", 1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// FreeTCPUDPPorts finds n distinct ports free for both TCP and UDP on ip.
// They are probed on ip itself, where the caller binds them (a port free
// on 127.0.0.1 can be taken on another address).
func FreeTCPUDPPorts(ip string, n int) ([]int, error) { return freePorts(ip, n, true) }

// lowestPort is the bottom of the range freePorts picks from.
const lowestPort = 10000

// freePorts finds n distinct ports free on ip for TCP (and UDP). They come
// from below the kernel's ephemeral range (net.ipv4.ip_local_port_range):
// a port from that range, free when probed, can become the local end of
// any outgoing connection (a Postgres or SeaweedFS client) before the
// caller binds it, and tests failed with "address already in use". Where
// the range leaves no room below it, the kernel picks (port 0). Each probe
// stays open until all n are found, so none is given twice.
func freePorts(ip string, n int, udp bool) ([]int, error) {
	top := ephemeralStart()
	var held []io.Closer
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	var ports []int
	var lastErr error
	for tries := 0; len(ports) < n; tries++ {
		if tries == 50*n {
			return nil, fmt.Errorf("find %d free ports on %s: %w", n, ip, lastErr)
		}
		want := 0
		if top > lowestPort {
			want = lowestPort + rand.IntN(top-lowestPort)
		}
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(want)))
		if err != nil {
			lastErr = err
			continue
		}
		held = append(held, l)
		p := l.Addr().(*net.TCPAddr).Port
		if udp {
			u, err := net.ListenPacket("udp", net.JoinHostPort(ip, strconv.Itoa(p)))
			if err != nil {
				lastErr = err
				continue
			}
			held = append(held, u)
		}
		ports = append(ports, p)
	}
	return ports, nil
}

// ephemeralStart is the first port of the kernel's ephemeral range, or 0
// when it cannot be read.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		return 0
	}
	return lo
}

// serviceUser is who runs the servers: Postgres refuses to run as root, so
// root runs them as the "postgres" user the Debian package creates.
type serviceUser struct {
	cred     *syscall.Credential
	uid, gid int
}

func postgresUser() (serviceUser, error) {
	if os.Geteuid() != 0 {
		return serviceUser{uid: os.Getuid(), gid: os.Getgid()}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return serviceUser{}, fmt.Errorf("look up the postgres user (install the postgresql package): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return serviceUser{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid: uid, gid: gid}, nil
}

func (s serviceUser) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	return cmd
}

// mkdir makes dir and gives it to the service user.
func (s serviceUser) mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chown(dir, s.uid, s.gid)
}

func findBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(matches) > 0 {
		return matches[len(matches)-1], nil
	}
	return "", fmt.Errorf("%s not found (install the postgresql package)", name)
}

func waitTCP(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %s: %w", addr, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func run(cmd *exec.Cmd, what string) error {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", what, err, lastLines(out, 8))
	}
	return nil
}

func lastLines(b []byte, n int) string {
	lines := 0
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			lines++
			if lines > n {
				return string(b[i+1:])
			}
		}
	}
	return string(b)
}

// canReach checks that every parent of dir is searchable by others, which
// the service user needs when it is not the caller.
func (s serviceUser) canReach(dir string) error {
	if s.cred == nil {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is not searchable by the postgres user (mode %v): choose a data dir whose parents are mode 0711 or wider", p, st.Mode().Perm())
		}
		if p == "/" {
			return nil
		}
	}
}

var errNotRunning = errors.New("not running")
