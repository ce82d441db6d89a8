package egress

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
)

// world is a small network of namespaces: a node namespace (where the
// bridge and the rules live, standing in for the host) and a world
// namespace behind its uplink holding every destination the tests probe.
// Nothing leaves these namespaces.
type world struct {
	prefix    string
	nodeNS    string // path
	worldNS   string // path
	stateDir  string
	listeners []net.Listener
	udp       []net.PacketConn
}

// Addresses in the world namespace.
var worldAddrs = []string{
	"169.254.169.254/32", "168.63.129.16/32", "100.100.100.200/32", "169.254.10.10/32",
	"192.168.77.10/32", "203.0.113.10/32", "192.0.2.53/32", "10.250.0.5/32", "100.64.5.5/32",
	"fd00:ec2::254/128", "2001:db8::10/128", "2001:db8::53/128", "fd12:3456::10/128",
}

const (
	nodeUplink4 = "198.18.0.1"
	nodeUplink6 = "2001:db8:ff::1"
	nodePort    = "9100"
	ctrPort     = "7000"
)

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func randomPrefix(t testing.TB) string {
	b := make([]byte, 2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "l9e" + hex.EncodeToString(b)
}

// removeTestLeftovers deletes namespaces a killed earlier run of these
// tests left (all named l9e*), so the host does not fill up.
func removeTestLeftovers(t testing.TB) {
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "l9e") {
			info, err := e.Info()
			if err == nil && time.Since(info.ModTime()) > 10*time.Minute {
				_ = deleteNetns(e.Name())
			}
		}
	}
}

func newWorld(t *testing.T) *world {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "ip", "iptables", "ip6tables", "iptables-restore", "ip6tables-restore", "iptables-save")
	removeTestLeftovers(t)
	w := &world{prefix: randomPrefix(t), stateDir: t.TempDir()}
	node, wld := w.prefix+"-node", w.prefix+"-world"
	w.nodeNS, w.worldNS = filepath.Join(netnsDir, node), filepath.Join(netnsDir, wld)
	run(t, "ip", "netns", "add", node)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", node).Run() })
	run(t, "ip", "netns", "add", wld)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", wld).Run() })
	up, wu := w.prefix+"up", w.prefix+"wu"
	run(t, "ip", "-n", node, "link", "add", up, "type", "veth", "peer", "name", wu, "netns", wld)
	run(t, "ip", "-n", node, "addr", "add", nodeUplink4+"/24", "dev", up)
	run(t, "ip", "-n", node, "addr", "add", nodeUplink6+"/64", "dev", up, "nodad")
	run(t, "ip", "-n", node, "link", "set", up, "up")
	run(t, "ip", "-n", node, "link", "set", "lo", "up")
	run(t, "ip", "-n", node, "route", "add", "default", "via", "198.18.0.2")
	run(t, "ip", "-n", node, "-6", "route", "add", "default", "via", "2001:db8:ff::2")
	run(t, "ip", "-n", wld, "addr", "add", "198.18.0.2/24", "dev", wu)
	run(t, "ip", "-n", wld, "addr", "add", "2001:db8:ff::2/64", "dev", wu, "nodad")
	run(t, "ip", "-n", wld, "link", "set", wu, "up")
	run(t, "ip", "-n", wld, "link", "set", "lo", "up")
	for _, a := range worldAddrs {
		args := []string{"ip", "-n", wld, "addr", "add", a, "dev", "lo"}
		if strings.Contains(a, ":") {
			args = append(args, "nodad")
		}
		run(t, args...)
	}
	// TCP servers answer with their own address, so a probe knows who
	// answered; UDP ones echo (the DNS resolvers).
	for _, a := range []string{"169.254.169.254", "168.63.129.16", "100.100.100.200", "169.254.10.10", "192.168.77.10", "203.0.113.10", "100.64.5.5", "fd00:ec2::254", "2001:db8::10", "fd12:3456::10"} {
		w.serveTCP(t, w.worldNS, net.JoinHostPort(a, "80"))
	}
	w.serveTCP(t, w.worldNS, "192.168.77.10:8080")
	w.serveTCP(t, w.worldNS, "[fd12:3456::10]:8080")
	w.serveTCP(t, w.worldNS, "10.250.0.5:1995")
	w.serveUDP(t, w.worldNS, "192.0.2.53:53")
	w.serveUDP(t, w.worldNS, "[2001:db8::53]:53")
	w.serveUDP(t, w.worldNS, "203.0.113.10:53")
	w.serveUDP(t, w.worldNS, "[2001:db8::10]:53")
	// A listener on the node itself, on every node address.
	w.serveTCP(t, w.nodeNS, ":"+nodePort)
	t.Cleanup(w.close)
	return w
}

func (w *world) close() {
	for _, l := range w.listeners {
		_ = l.Close()
	}
	for _, c := range w.udp {
		_ = c.Close()
	}
}

func (w *world) serveTCP(t testing.TB, ns, addr string) {
	t.Helper()
	var l net.Listener
	if err := inNetns(ns, func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	w.listeners = append(w.listeners, l)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = fmt.Fprintf(c, "ok %s\n", c.LocalAddr())
			_ = c.Close()
		}
	}()
}

func (w *world) serveUDP(t testing.TB, ns, addr string) {
	t.Helper()
	var c net.PacketConn
	if err := inNetns(ns, func() (err error) { c, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatalf("listen udp %s: %v", addr, err)
	}
	w.udp = append(w.udp, c)
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteTo(append([]byte("ok "), buf[:n]...), from)
		}
	}()
}

// config returns a node config for the world.
func (w *world) config(mode Mode, allow ...string) Config {
	return Config{
		Prefix:          w.prefix,
		Security:        SecurityConfig{BridgePortIsolation: true, Egress: EgressConfig{Mode: mode, Allow: allow}},
		SubnetV4:        "10.209.0.0/24",
		SubnetV6:        "fd6c:7639:9000::/64",
		Resolvers:       []string{"192.0.2.53", "2001:db8::53"},
		Controlplane:    []string{"10.250.0.5:1995/tcp"},
		NodeNetns:       w.nodeNS,
		StateDir:        w.stateDir,
		NFLOGGroup:      1993,
		LogPerMinute:    600,
		LogBurst:        50,
		CollectInterval: time.Hour, // tests call Collect themselves
	}
}

// probe connects from inside a container namespace and returns the answer.
func probe(nsPath, network, addr string) (string, error) {
	var reply string
	err := inNetns(nsPath, func() error {
		c, err := net.DialTimeout(network, addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if strings.HasPrefix(network, "udp") {
			if _, err := c.Write([]byte("query")); err != nil {
				return err
			}
			buf := make([]byte, 512)
			n, err := c.Read(buf)
			if err != nil {
				return err
			}
			reply = string(buf[:n])
			return nil
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		reply = strings.TrimSpace(line)
		return err
	})
	return reply, err
}

// logRecorder is a slog handler that keeps records for assertions.
type logRecorder struct {
	mu   sync.Mutex
	recs []map[string]string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	l.recs = append(l.recs, m)
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) find(msg string, kv map[string]string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r["msg"] != msg {
			continue
		}
		ok := true
		for k, v := range kv {
			if r[k] != v {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// saveRules returns the rules and user chains of iptables-save and
// ip6tables-save in a namespace (an empty table and a missing one, which
// iptables-nft creates lazily, compare equal).
func saveRules(t testing.TB, nsPath string) string {
	t.Helper()
	var out strings.Builder
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		o := run(t, "ip", "netns", "exec", filepath.Base(nsPath), bin)
		table := ""
		for _, line := range strings.Split(o, "\n") {
			switch {
			case strings.HasPrefix(line, "*"):
				table = line
			case strings.HasPrefix(line, "-A "):
				out.WriteString(bin + " " + table + " " + line + "\n")
			case strings.HasPrefix(line, ":") && !builtinDecl.MatchString(line):
				out.WriteString(bin + " " + table + " " + line + "\n")
			}
		}
	}
	return out.String()
}

var builtinDecl = regexp.MustCompile(`^:(INPUT|FORWARD|OUTPUT|PREROUTING|POSTROUTING) ACCEPT `)

// ourObjects lists namespaces, links and state dirs carrying prefix+"-"
// or prefix+"v"/"br" (the world's own namespaces are excluded).
func ourObjects(t testing.TB, w *world) []string {
	t.Helper()
	var objs []string
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, w.prefix) && n != w.prefix+"-node" && n != w.prefix+"-world" {
			objs = append(objs, "netns "+n)
		}
	}
	for _, l := range strings.Split(run(t, "ip", "-n", w.prefix+"-node", "-o", "link", "show"), "\n") {
		f := strings.Fields(l)
		if len(f) > 1 {
			name := strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0]
			if strings.HasPrefix(name, w.prefix) && name != w.prefix+"up" {
				objs = append(objs, "link "+name)
			}
		}
	}
	sd, _ := os.ReadDir(w.stateDir)
	for _, e := range sd {
		objs = append(objs, "state "+e.Name())
	}
	return objs
}

func slogNew(h slog.Handler) *slog.Logger { return slog.New(h) }
