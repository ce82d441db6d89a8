package tunnel_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/tunnel"
)

// Host objects of these tests: network namespaces l9t<hex>s (controlplane)
// and l9t<hex>c (agent) joined by the veth pair l9t<hex>a/l9t<hex>b, with
// 10.199.0.1 and 10.199.0.2 inside them; iptables rules live only inside these
// namespaces and go with them.
var netnsName = regexp.MustCompile(`^l9t[0-9a-f]{6}[sc]$`)

// reconcileNetns removes namespaces a killed test run left behind.
func reconcileNetns() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && netnsName.MatchString(f[0]) {
			_ = exec.Command("ip", "netns", "del", f[0]).Run()
		}
	}
}

type nsPair struct {
	srv, cli   string
	srvH, cliH netns.NsHandle
	srvIP      string
}

func run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func setupNetns(t testing.TB) *nsPair {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "ip", "iptables")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := "l9t" + hex.EncodeToString(b)
	p := &nsPair{srv: id + "s", cli: id + "c", srvIP: "10.199.0.1"}
	run(t, "ip", "netns", "add", p.srv)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.srv).Run() })
	run(t, "ip", "netns", "add", p.cli)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.cli).Run() })
	run(t, "ip", "link", "add", id+"a", "netns", p.srv, "type", "veth", "peer", "name", id+"b", "netns", p.cli)
	run(t, "ip", "-n", p.srv, "addr", "add", "10.199.0.1/24", "dev", id+"a")
	run(t, "ip", "-n", p.cli, "addr", "add", "10.199.0.2/24", "dev", id+"b")
	for _, ns := range []string{p.srv, p.cli} {
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", p.srv, "link", "set", id+"a", "up")
	run(t, "ip", "-n", p.cli, "link", "set", id+"b", "up")
	var err error
	if p.srvH, err = netns.GetFromName(p.srv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.srvH.Close() })
	if p.cliH, err = netns.GetFromName(p.cli); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.cliH.Close() })
	return p
}

// inNS runs f on an OS thread switched into ns; sockets f creates stay
// there. If the thread cannot switch back it is not returned to the pool.
func inNS(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		ferr := f()
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// iptables runs iptables inside ns (one of the pair). Rules go in INPUT so
// packets vanish silently on the wire the way a middlebox drops them; an
// OUTPUT DROP would instead fail sendmsg with EPERM locally.
func (p *nsPair) iptables(t testing.TB, ns string, args ...string) {
	t.Helper()
	run(t, append([]string{"ip", "netns", "exec", ns, "iptables", "-w"}, args...)...)
}

// both applies an iptables rule in both namespaces.
func (p *nsPair) both(t testing.TB, args ...string) {
	t.Helper()
	p.iptables(t, p.srv, args...)
	p.iptables(t, p.cli, args...)
}

func (p *nsPair) serverStart(start func() error) error { return inNS(p.srvH, start) }

// clientSockets makes the agent's sockets inside its namespace.
func (p *nsPair) clientSockets(c *tunnel.ClientConfig) {
	c.DialTCP = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := inNS(p.cliH, func() error {
			var d net.Dialer
			var err error
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
	c.ListenUDP = func(context.Context) (net.PacketConn, error) {
		var pc net.PacketConn
		err := inNS(p.cliH, func() error {
			var err error
			pc, err = net.ListenUDP("udp", &net.UDPAddr{})
			return err
		})
		return pc, err
	}
}

func (p *nsPair) addr(port string) string { return fmt.Sprintf("%s:%s", p.srvIP, port) }
