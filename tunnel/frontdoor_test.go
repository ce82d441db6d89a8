package tunnel_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/tunnel"
)

// spoofedInitial is a datagram shaped like a QUIC v1 Initial (long header,
// fresh connection IDs, padded to 1200 bytes) whose payload is noise: the
// server cannot tell it from a real one until it tries to decrypt it, and
// it never completes. Initial keys are public (derived from the
// destination connection ID), so a real attacker can as well send valid
// ClientHellos; either way the server holds state until the handshake
// timeout unless it asks for a Retry first.
func spoofedInitial() []byte {
	p := make([]byte, 1200)
	_, _ = rand.Read(p)
	p[0] = 0xc3                           // long header, fixed bit, Initial, 4-byte packet number
	binary.BigEndian.PutUint32(p[1:5], 1) // QUIC v1
	p[5] = 8                              // destination connection ID (bytes 6..13)
	p[14] = 8                             // source connection ID (bytes 15..22)
	p[23] = 0                             // no token
	l := len(p) - 26
	p[24], p[25] = 0x40|byte(l>>8), byte(l) // length, a 2-byte varint
	return p
}

// spoofInitials sends spoofed Initials to server from each of srcs, perSec
// per source, until ctx ends.
func spoofInitials(ctx context.Context, t testing.TB, wg *sync.WaitGroup, server string, srcs []netip.Addr, perSec int) {
	dst, err := net.ResolveUDPAddr("udp", server)
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range srcs {
		u, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer u.Close()
			tick := time.NewTicker(time.Second / time.Duration(perSec))
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					_, _ = u.WriteTo(spoofedInitial(), dst)
				}
			}
		})
	}
}

// slowloris keeps n TCP connections from src open to server, each having
// sent three bytes of a TLS record header and nothing more; a connection
// the server closes is opened again at once, one it refused after a pause.
// held counts the connections the server kept for at least a second.
func slowloris(ctx context.Context, wg *sync.WaitGroup, server string, src netip.Addr, n int, held *atomic.Int64) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", server)
				if err != nil {
					pause(ctx, 100*time.Millisecond)
					continue
				}
				stop := context.AfterFunc(ctx, func() { _ = c.Close() })
				start := time.Now()
				_, _ = c.Write([]byte{22, 3, 1})
				_, _ = io.Copy(io.Discard, c)
				_ = c.Close()
				stop()
				if time.Since(start) >= time.Second {
					held.Add(1)
				} else {
					pause(ctx, time.Second) // refused: come back later
				}
			}
		})
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// fleetAgent starts an Auto whose sockets are bound to src and marks in
// the first time it gets a session.
func fleetAgent(t testing.TB, e *cpEnv, ctls *tls.Config, src netip.Addr, live tunnel.Liveness, in func()) *tunnel.Auto {
	t.Helper()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	var once sync.Once
	a, err := tunnel.NewAuto(tunnel.ClientConfig{
		Addrs: []string{e.addr}, TLS: ctls, Liveness: live, Proxy: noProxy,
		BackoffBase: 200 * time.Millisecond, BackoffMax: 2 * time.Second,
		DialTCP: d.DialContext,
		ListenUDP: func(context.Context) (net.PacketConn, error) {
			return net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		},
	}, func(ctx context.Context, _ tunnel.Session) {
		once.Do(in)
		<-ctx.Done()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return a
}

// The front door under attack: spoofed QUIC Initials from a few addresses
// and a slowloris (connections that send three bytes and stall) from one
// address, while a fleet of 500 agents behind four other addresses (125
// behind each, as behind a NAT) connects at once, as after a controlplane
// restart. Every agent gets in within the bound: the attackers' handshakes
// are capped per source, spoofed Initials must answer a Retry once the
// server is busy, and a connection that has not sent its ClientHello is
// closed after ClientHelloTimeout instead of holding a slot for the whole
// handshake timeout.
var fleetAgents int64 = 500

func TestFrontDoorUnderAttackFleetGetsIn(t *testing.T) {
	if testing.Short() {
		t.Skip("500 agents and two attacks: not under -short")
	}
	agents := fleetAgents
	const bound = 30 * time.Second
	live := tunnel.Liveness{HeartbeatInterval: 2 * time.Second, HeartbeatTimeout: 10 * time.Second, HandshakeTimeout: 10 * time.Second}
	e := setupCP(t, cpOpts{live: live, maxHandshakes: 256})

	ctx, cancel := context.WithCancel(context.Background())
	var attackers sync.WaitGroup
	defer attackers.Wait()
	defer cancel()
	var held atomic.Int64
	slowloris(ctx, &attackers, e.addr, netip.MustParseAddr("127.0.0.9"), 300, &held)
	spoofInitials(ctx, t, &attackers, e.addr, []netip.Addr{
		netip.MustParseAddr("127.0.0.20"), netip.MustParseAddr("127.0.0.21"),
		netip.MustParseAddr("127.0.0.22"), netip.MustParseAddr("127.0.0.23"),
	}, 100)
	// Let the attack take what it can before the fleet arrives.
	testenv.Eventually(t, 10*time.Second, "the attack holds handshake slots", func() bool {
		return e.srv.InflightHandshakesForTest() >= 128
	})
	t.Logf("attack holds %d handshake slots", e.srv.InflightHandshakesForTest())

	certs := make([]*tls.Config, agents)
	for i := range certs {
		var err error
		if certs[i], err = e.ca.ClientTLS("m-fleet-" + strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	var in atomic.Int64
	start := time.Now()
	autos := make([]*tunnel.Auto, 0, agents)
	for i, ctls := range certs {
		src := netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i%4)})
		autos = append(autos, fleetAgent(t, e, ctls, src, live, func() { in.Add(1) }))
	}
	t.Logf("%d agents started in %s", agents, time.Since(start).Round(time.Millisecond))
	defer func() {
		var wg sync.WaitGroup
		for _, a := range autos {
			wg.Go(a.Stop)
		}
		wg.Wait()
	}()
	defer func() {
		t.Logf("%d/%d agents in after %s; server sessions %d, handshake slots taken %d, slowloris connections held >= 1 s: %d",
			in.Load(), agents, time.Since(start).Round(time.Millisecond), e.srv.SessionsForTest(), e.srv.InflightHandshakesForTest(), held.Load())
		for _, r := range []string{"ok", "refused", "refused_source", "failed", "abandoned"} {
			t.Logf("server handshakes %s: %v", r, e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", r))
		}
	}()
	testenv.Eventually(t, bound, "every agent in under attack", func() bool { return in.Load() == agents })
}

// boundTo makes an agent's sockets on src.
func boundTo(src netip.Addr) func(*tunnel.ClientConfig) {
	return func(c *tunnel.ClientConfig) {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
		c.DialTCP = d.DialContext
		c.ListenUDP = func(context.Context) (net.PacketConn, error) {
			return net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		}
	}
}

func dialFrom(t *testing.T, src netip.Addr, server string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	c, err := d.Dial("tcp", server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// One source gets MaxHandshakesPerSource handshakes at a time, over both
// transports; other sources are not hurt, and sessions are not capped per
// source (a fleet behind one NAT address gets in).
func TestHandshakesCappedPerSource(t *testing.T) {
	live := fast
	live.HandshakeTimeout = 5 * time.Second
	e := setupCP(t, cpOpts{live: live, perSource: 2, helloTimeout: 5 * time.Second})
	attacker := netip.MustParseAddr("127.0.0.9")
	for range 2 {
		_, _ = dialFrom(t, attacker, e.addr).Write([]byte{22, 3, 1})
	}
	testenv.Eventually(t, 2*time.Second, "the attacker holds two slots", func() bool { return e.srv.InflightHandshakesForTest() == 2 })

	// A third TCP connection from it gets the busy record at once.
	c := dialFrom(t, attacker, e.addr)
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	rec := make([]byte, 5)
	if _, err := io.ReadFull(c, rec); err != nil || string(rec[:3]) != "L9B" {
		t.Fatalf("third connection from one source: read %q, %v; want a busy record", rec, err)
	}
	// So does a QUIC dial from it, with CONNECTION_REFUSED.
	ctls, err := e.ca.ClientTLS("m-attacker")
	if err != nil {
		t.Fatal(err)
	}
	cfg := tunnel.ClientConfig{Addrs: []string{e.addr}, TLS: ctls, Liveness: live, Proxy: noProxy, DisableTCP: true}
	boundTo(attacker)(&cfg)
	d, err := tunnel.NewDirect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	s, err := d.Dial(ctx, tunnel.DialRace)
	cancel()
	if err == nil {
		_ = s.Close()
		t.Fatal("QUIC admitted from a source over its handshake cap")
	}
	if r := (*tunnel.RefusedError)(nil); !errors.As(err, &r) {
		t.Fatalf("QUIC dial over the source cap: %v, want a refusal", err)
	}
	if got := e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "refused_source"); got < 2 {
		t.Fatalf("refused_source handshakes %v, want >= 2", got)
	}
	if got := e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "refused"); got != 0 {
		t.Fatalf("source refusals counted as global ones: %v", got)
	}

	// Six agents behind one other address, both transports, all get in
	// and stay: only handshakes are capped per source.
	nat := netip.MustParseAddr("127.0.0.3")
	for i := range 6 {
		cn := "m-nat-" + strconv.Itoa(i)
		setupAgent(t, e, cn, func(c *tunnel.ClientConfig) {
			boundTo(nat)(c)
			transports[i%2].mod(c)
		})
	}
	for i := range 6 {
		e.waitPush(t, 15*time.Second, "m-nat-"+strconv.Itoa(i), "in")
	}
	if n := e.srv.SessionsForTest(); n != 6 {
		t.Fatalf("%d sessions, want the 6 agents behind one address", n)
	}
}

// clientHello is the first TLS record an agent sends.
func clientHello(t *testing.T, e *cpEnv) []byte {
	t.Helper()
	ctls, err := e.ca.ClientTLS("m-hello")
	if err != nil {
		t.Fatal(err)
	}
	ctls.NextProtos = []string{tunnel.ALPN}
	ctls.ServerName = "127.0.0.1"
	c, s := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tls.Client(c, ctls).Handshake()
	}()
	rec := make([]byte, 5)
	if _, err := io.ReadFull(s, rec); err != nil {
		t.Fatal(err)
	}
	rec = append(rec, make([]byte, int(rec[3])<<8|int(rec[4]))...)
	if _, err := io.ReadFull(s, rec[5:]); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	_ = c.Close()
	<-done
	return rec
}

// A connection that has not sent its ClientHello is closed after
// ClientHelloTimeout; one that has gets the whole handshake timeout.
func TestClientHelloTimeoutClosesSilentConnections(t *testing.T) {
	live := fast
	live.HandshakeTimeout = 3 * time.Second
	e := setupCP(t, cpOpts{live: live, helloTimeout: 300 * time.Millisecond})
	hello := clientHello(t, e)
	for _, tc := range []struct {
		name     string
		send     []byte
		min, max time.Duration
	}{
		{"nothing", nil, 250 * time.Millisecond, 1500 * time.Millisecond},
		{"three bytes", []byte{22, 3, 1}, 250 * time.Millisecond, 1500 * time.Millisecond},
		{"half a ClientHello", hello[:len(hello)/2], 250 * time.Millisecond, 1500 * time.Millisecond},
		{"a ClientHello, then silence", hello, 2500 * time.Millisecond, 4500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "failed")
			c := dialFrom(t, netip.MustParseAddr("127.0.0.1"), e.addr)
			start := time.Now()
			if _, err := c.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(6 * time.Second))
			_, err := io.Copy(io.Discard, c)
			took := time.Since(start)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("server did not close the connection")
			}
			if took < tc.min || took > tc.max {
				t.Fatalf("closed after %s, want between %s and %s", took, tc.min, tc.max)
			}
			testenv.Eventually(t, 2*time.Second, "failed handshake counted", func() bool {
				return e.counter("levers9_tunnel_handshakes_total", "side", "server", "result", "failed") > before
			})
		})
	}
}

// Once QUICRetryThreshold handshakes are in flight, spoofed Initials (from
// many addresses, so the per-source cap does not stop them) take no more
// slots, and a real agent still gets in over QUIC through a Retry.
func TestQUICRetryOverThresholdStopsSpoofedInitials(t *testing.T) {
	live := fast
	live.HandshakeTimeout = 5 * time.Second
	e := setupCP(t, cpOpts{live: live, maxHandshakes: 32, retryAt: 8})
	ctx, cancel := context.WithCancel(context.Background())
	var spoofers sync.WaitGroup
	defer spoofers.Wait()
	defer cancel()
	var srcs []netip.Addr
	for i := range 8 {
		srcs = append(srcs, netip.AddrFrom4([4]byte{127, 0, 1, byte(1 + i)}))
	}
	spoofInitials(ctx, t, &spoofers, e.addr, srcs, 100)
	testenv.Eventually(t, 3*time.Second, "spoofed Initials hold slots", func() bool { return e.srv.InflightHandshakesForTest() >= 8 })
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if n := e.srv.InflightHandshakesForTest(); n > 8 {
			t.Fatalf("spoofed Initials hold %d slots past the Retry threshold of 8", n)
		}
	}
	setupAgent(t, e, "m-retry", func(c *tunnel.ClientConfig) {
		boundTo(netip.MustParseAddr("127.0.0.2"))(c)
		c.DisableTCP = true
	})
	e.waitPush(t, 10*time.Second, "m-retry", "in through a Retry")
}
