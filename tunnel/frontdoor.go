package tunnel

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// The front door: what a connection costs before its peer proved anything.
// A handshake slot is taken at accept (TCP) or at the first Initial
// (QUIC), before any crypto, and is one of MaxConcurrentHandshakes and of
// its source's MaxHandshakesPerSource. Sessions are not counted per
// source: a fleet behind one NAT address gets in, a few handshakes at a
// time.

// handshakeSlot is one of MaxConcurrentHandshakes and of its source's
// MaxHandshakesPerSource; release is idempotent.
type handshakeSlot struct {
	once sync.Once
	s    *Server
	src  netip.Prefix
}

func (h *handshakeSlot) release() {
	if h != nil {
		h.once.Do(func() {
			h.s.inflight.Add(-1)
			h.s.sources.release(h.src)
		})
	}
}

type slotKey struct{}

// takeSlot takes a handshake slot for a connection from remote, or counts
// and names the refusal (resultRefused: over the global cap;
// resultRefusedSource: over the source's).
func (s *Server) takeSlot(remote net.Addr) (*handshakeSlot, string) {
	src := sourceOf(remote)
	if !s.sources.take(src) {
		s.cfg.Metrics.handshakes.WithLabelValues("server", resultRefusedSource).Inc()
		return nil, resultRefusedSource
	}
	if s.inflight.Add(1) > int64(s.cfg.MaxConcurrentHandshakes) {
		s.inflight.Add(-1)
		s.sources.release(src)
		s.cfg.Metrics.handshakes.WithLabelValues("server", resultRefused).Inc()
		return nil, resultRefused
	}
	return &handshakeSlot{s: s, src: src}, ""
}

// refusedErr explains a refusal from takeSlot.
func (s *Server) refusedErr(remote net.Addr, why string) error {
	if why == resultRefusedSource {
		return fmt.Errorf("tunnel server: %d handshakes in flight from %s: %w", s.cfg.MaxHandshakesPerSource, sourceOf(remote), errdefs.ErrUnavailable)
	}
	return fmt.Errorf("tunnel server: %d handshakes in flight: %w", s.cfg.MaxConcurrentHandshakes, errdefs.ErrUnavailable)
}

// busyHint is the retry-after a refusal from takeSlot carries. Only global
// refusals join the admission queue: a source over its own cap (one
// attacker opening connections in a loop) must not push back the hints
// every other agent gets.
func (s *Server) busyHint(why string) time.Duration {
	if why == resultRefusedSource {
		return minBusyWait
	}
	return s.adm.busy(s.cfg.Clock.Now())
}

// needsRetry is quic.Transport.VerifySourceAddress: once
// QUICRetryThreshold handshakes are in flight, a QUIC connection from an
// address not yet validated must first echo a Retry token, so Initials
// with a spoofed source take no slot at all.
func (s *Server) needsRetry(net.Addr) bool {
	return s.inflight.Load() >= int64(s.cfg.QUICRetryThreshold)
}

// sourceOf is the unit MaxHandshakesPerSource counts: an IPv4 address or
// an IPv6 /64 (what one host, or one customer, usually gets). Addresses
// that are neither share one zero prefix.
func sourceOf(a net.Addr) netip.Prefix {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		if a != nil {
			ap, _ = netip.ParseAddrPort(a.String())
		}
	}
	ip := ap.Addr().Unmap().WithZone("")
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// sourceCounts counts handshakes in flight per source; a source with none
// has no entry.
type sourceCounts struct {
	max int
	// mu guards n.
	mu sync.Mutex
	n  map[netip.Prefix]int
}

func newSourceCounts(max int) *sourceCounts {
	return &sourceCounts{max: max, n: make(map[netip.Prefix]int)}
}

func (sc *sourceCounts) take(p netip.Prefix) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.n[p] >= sc.max {
		return false
	}
	sc.n[p]++
	return true
}

func (sc *sourceCounts) release(p netip.Prefix) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.n[p] <= 1 {
		delete(sc.n, p)
		return
	}
	sc.n[p]--
}

const (
	recordTypeHandshake = 22
	maxRecordLen        = 16384 + 256 // TLS 1.3: plaintext limit plus expansion
)

// readClientHello reads a TCP connection's first TLS record (the
// ClientHello) within d: a peer that sends nothing, or only part of a
// record, in that time holds its slot for d instead of the whole
// handshake timeout. It does not parse the record; crypto/tls does that,
// reading it again through a prefixConn.
func readClientHello(c net.Conn, d time.Duration) ([]byte, error) {
	if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
		return nil, err
	}
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return nil, fmt.Errorf("no ClientHello within %s: %w", d, err)
	}
	if hdr[0] != recordTypeHandshake {
		return nil, fmt.Errorf("first record has type %d, not a TLS handshake: %w", hdr[0], errdefs.ErrInvalidArgument)
	}
	n := int(binary.BigEndian.Uint16(hdr[3:5]))
	if n > maxRecordLen {
		return nil, fmt.Errorf("first TLS record of %d bytes, over %d: %w", n, maxRecordLen, errdefs.ErrInvalidArgument)
	}
	rec := make([]byte, 5+n)
	copy(rec, hdr)
	if _, err := io.ReadFull(c, rec[5:]); err != nil {
		return nil, fmt.Errorf("no ClientHello within %s: %w", d, err)
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return rec, nil
}

// prefixConn reads prefix before the connection's own bytes.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.prefix) > 0 {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		if len(p.prefix) == 0 {
			// The connection lives as long as its session: do not keep
			// the ClientHello's buffer (a few KiB per agent) with it.
			p.prefix = nil
		}
		return n, nil
	}
	return p.Conn.Read(b)
}
