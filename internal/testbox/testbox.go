// Package testbox gives whole-stack tests (test/e2e, test/chaos) their
// machines: a network namespace joined to the host by a veth pair on a /30,
// and the project's commands built once into a directory. It changes host
// state (namespaces, links, addresses) and removes what it made when the
// test ends. Imported only by tests.
package testbox

import (
	"crypto/rand"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/testenv"
)

// Box is a machine in its own network namespace, joined to the host by a
// veth pair on a /30 that exists only between the two ends.
type Box struct {
	NS     string
	HostIP string
	BoxIP  string
}

// IP runs ip(8) with args and fails t if it fails.
func IP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// New makes a namespace <prefix><hex> with veths <ns>h (host) and <ns>b
// (box) on 10.<second>.N.0/30. Test packages that run side by side use
// their own prefix and second octet.
func New(t testing.TB, prefix string, second int) *Box {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "ip")
	// The name and the /30 come from one number; a namespace of that name
	// already there (another test's box) means another number.
	var b *Box
	for try := 0; ; try++ {
		n, _ := rand.Int(rand.Reader, big.NewInt(200))
		suffix := fmt.Sprintf("%04x", n.Int64()*251%65536)
		b = &Box{NS: prefix + suffix, HostIP: fmt.Sprintf("10.%d.%d.1", second, n.Int64()+20), BoxIP: fmt.Sprintf("10.%d.%d.2", second, n.Int64()+20)}
		out, err := exec.Command("ip", "netns", "add", b.NS).CombinedOutput()
		if err == nil {
			break
		}
		if try == 20 || !strings.Contains(string(out), "File exists") {
			t.Fatalf("ip netns add %s: %v: %s", b.NS, err, out)
		}
	}
	host, peer := b.NS+"h", b.NS+"b"
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", host).Run()
		_ = exec.Command("ip", "netns", "del", b.NS).Run()
	})
	IP(t, "link", "add", host, "type", "veth", "peer", "name", peer)
	IP(t, "link", "set", peer, "netns", b.NS)
	IP(t, "addr", "add", b.HostIP+"/30", "dev", host)
	IP(t, "link", "set", host, "up")
	IP(t, "-n", b.NS, "addr", "add", b.BoxIP+"/30", "dev", peer)
	IP(t, "-n", b.NS, "link", "set", peer, "up")
	IP(t, "-n", b.NS, "link", "set", "lo", "up")
	return b
}

// BuildCommands builds the packages cmds (such as "./cmd/levers9") of the
// module at root into a new world-readable directory, with ldflags when not
// empty. cleanup removes the directory.
func BuildCommands(root, ldflags string, cmds ...string) (dir string, cleanup func(), err error) {
	dir, err = os.MkdirTemp("", "l9-bin-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	// Agents and tasks started from here may run as other users.
	if err := os.Chmod(dir, 0o755); err != nil {
		cleanup()
		return "", nil, err
	}
	args := []string{"build"}
	if ldflags != "" {
		args = append(args, "-ldflags", ldflags)
	}
	args = append(args, "-o", dir+"/")
	cmd := exec.Command("go", append(args, cmds...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("build %s: %v\n%s", strings.Join(cmds, " "), err, out)
	}
	return dir, cleanup, nil
}
