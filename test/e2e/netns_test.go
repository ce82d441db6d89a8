package e2e

import (
	"testing"

	"github.com/levers9/levers9/internal/testbox"
)

// box is a machine in its own network namespace, joined to the host by a
// veth pair on a /30 that exists only between the two ends.
type box struct {
	ns     string
	hostIP string
	boxIP  string
}

func ip(t *testing.T, args ...string) { t.Helper(); testbox.IP(t, args...) }

// newBox makes a namespace l9j<hex> on 10.199.N.0/30 (test/chaos uses
// l9k and 10.198).
func newBox(t *testing.T) *box {
	t.Helper()
	b := testbox.New(t, "l9j", 199)
	return &box{ns: b.NS, hostIP: b.HostIP, boxIP: b.BoxIP}
}
