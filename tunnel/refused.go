package tunnel

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
)

// refusedAsLost is a UDP socket on which a datagram the host refuses to
// send (EPERM from sendmsg: a netfilter DROP in OUTPUT, a full conntrack
// table) counts as lost on the way, which is all the peer sees of it, and
// QUIC's loss recovery sends it again. quic-go ends a connection on any
// send error but a few, so otherwise one dropped datagram would end a live
// session. Until tolerant is set, EPERM still fails the send: a host that
// refuses UDP outright fails the dial at once and TCP takes over.
type refusedAsLost struct {
	*net.UDPConn
	tolerant atomic.Bool
	refused  prometheus.Counter
}

// tolerateRefusals wraps pc when it is a UDP socket (quic-go sees the same
// OOB-capable socket), tolerant from the start or not; other sockets come
// back as they are, with nil.
func tolerateRefusals(pc net.PacketConn, refused prometheus.Counter, tolerant bool) (net.PacketConn, *refusedAsLost) {
	u, ok := pc.(*net.UDPConn)
	if !ok {
		return pc, nil
	}
	r := &refusedAsLost{UDPConn: u, refused: refused}
	r.tolerant.Store(tolerant)
	return r, r
}

func (c *refusedAsLost) lost(err error) bool {
	if err == nil || !c.tolerant.Load() || !errors.Is(err, syscall.EPERM) {
		return false
	}
	c.refused.Inc()
	return true
}

func (c *refusedAsLost) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	n, oobn, err := c.UDPConn.WriteMsgUDP(b, oob, addr)
	if c.lost(err) {
		return len(b), len(oob), nil
	}
	return n, oobn, err
}

func (c *refusedAsLost) WriteTo(b []byte, addr net.Addr) (int, error) {
	n, err := c.UDPConn.WriteTo(b, addr)
	if c.lost(err) {
		return len(b), nil
	}
	return n, err
}
