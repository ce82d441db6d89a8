package e2e

import (
	"crypto/rand"
	"fmt"
	"math/big"
	"os/exec"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/testenv"
)

// box is a machine in its own network namespace, joined to the host by a
// veth pair on a /30 that exists only between the two ends.
type box struct {
	ns     string
	hostIP string
	boxIP  string
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newBox makes a namespace l9j<rand> with veths l9j<rand>h (host) and
// l9j<rand>b (box).
func newBox(t *testing.T) *box {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "ip")
	// The name and the /30 come from one number; a namespace of that name
	// already there (another test's box, tests run side by side) means
	// another number.
	var b *box
	for try := 0; ; try++ {
		n, _ := rand.Int(rand.Reader, big.NewInt(200))
		suffix := fmt.Sprintf("%04x", n.Int64()*251%65536)
		b = &box{ns: "l9j" + suffix, hostIP: fmt.Sprintf("10.199.%d.1", n.Int64()+20), boxIP: fmt.Sprintf("10.199.%d.2", n.Int64()+20)}
		out, err := exec.Command("ip", "netns", "add", b.ns).CombinedOutput()
		if err == nil {
			break
		}
		if try == 20 || !strings.Contains(string(out), "File exists") {
			t.Fatalf("ip netns add %s: %v: %s", b.ns, err, out)
		}
	}
	host, peer := b.ns+"h", b.ns+"b"
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", host).Run()
		_ = exec.Command("ip", "netns", "del", b.ns).Run()
	})
	ip(t, "link", "add", host, "type", "veth", "peer", "name", peer)
	ip(t, "link", "set", peer, "netns", b.ns)
	ip(t, "addr", "add", b.hostIP+"/30", "dev", host)
	ip(t, "link", "set", host, "up")
	ip(t, "-n", b.ns, "addr", "add", b.boxIP+"/30", "dev", peer)
	ip(t, "-n", b.ns, "link", "set", peer, "up")
	ip(t, "-n", b.ns, "link", "set", "lo", "up")
	return b
}
