package tunnel

import (
	"net"
	"testing"
	"time"
)

func TestAdmissionSpreadsRefusals(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAdmission(10, 2, now)
	for i := range 2 {
		if ok, _ := a.admit(now); !ok {
			t.Fatalf("burst admission %d refused", i)
		}
	}
	var last time.Duration
	for i := range 20 {
		ok, wait := a.admit(now)
		if ok {
			t.Fatalf("admission %d over the burst granted", i)
		}
		if wait <= last {
			t.Fatalf("refusal %d hint %s not after previous %s", i, wait, last)
		}
		last = wait
	}
	// 20 refused at 10/s: the last is told to come back about 2 s later.
	if last < 1900*time.Millisecond || last > 2300*time.Millisecond {
		t.Fatalf("last hint %s, want about 2 s", last)
	}
	// After a second the bucket refilled by 10 (capped at the burst).
	if ok, _ := a.admit(now.Add(time.Second)); !ok {
		t.Fatal("refilled bucket refused")
	}
	// The hint is capped.
	b := newAdmission(0.001, 1, now)
	b.admit(now)
	if _, wait := b.admit(now); wait != maxRetryAfter {
		t.Fatalf("hint %s, want cap %s", wait, maxRetryAfter)
	}
}

func TestFullJitterBounds(t *testing.T) {
	for range 1000 {
		if d := fullJitter(time.Second); d < 0 || d > time.Second {
			t.Fatalf("jitter %s outside [0, 1s]", d)
		}
	}
	if fullJitter(0) != 0 {
		t.Fatal("jitter of 0")
	}
}

func TestConfigValidateNamesFields(t *testing.T) {
	err := ClientConfig{Addrs: []string{"nohost"}, DisableQUIC: true, DisableTCP: true}.WithDefaults().Validate()
	for _, want := range []string{"tunnel.client.addrs[0]", "tunnel.client.tls", "tunnel.client.disableQUIC/disableTCP"} {
		if err == nil || !contains(err.Error(), want) {
			t.Errorf("client validation %v does not name %s", err, want)
		}
	}
	err = ServerConfig{Liveness: Liveness{HeartbeatInterval: time.Second, HeartbeatTimeout: time.Second}}.WithDefaults().Validate()
	for _, want := range []string{"tunnel.server.tls", "tunnel.server.authorize", "tunnel.server.heartbeatTimeout"} {
		if err == nil || !contains(err.Error(), want) {
			t.Errorf("server validation %v does not name %s", err, want)
		}
	}
	err = ServerConfig{MaxHandshakesPerSource: -1, QUICRetryThreshold: -1, ClientHelloTimeout: -time.Second}.WithDefaults().Validate()
	for _, want := range []string{"tunnel.server.maxHandshakesPerSource", "tunnel.server.quicRetryThreshold", "tunnel.server.clientHelloTimeout"} {
		if err == nil || !contains(err.Error(), want) {
			t.Errorf("server validation %v does not name %s", err, want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestFrontDoorDefaults(t *testing.T) {
	c := ServerConfig{}.WithDefaults()
	if c.MaxHandshakesPerSource != 64 || c.QUICRetryThreshold != c.MaxConcurrentHandshakes/2 || c.ClientHelloTimeout != 3*time.Second {
		t.Fatalf("defaults: perSource %d, retry at %d of %d, ClientHello timeout %s", c.MaxHandshakesPerSource, c.QUICRetryThreshold, c.MaxConcurrentHandshakes, c.ClientHelloTimeout)
	}
	if c := (ServerConfig{MaxConcurrentHandshakes: 1}).WithDefaults(); c.QUICRetryThreshold != 1 {
		t.Fatalf("retry threshold for a cap of 1: %d", c.QUICRetryThreshold)
	}
}

func TestSourceOfCountsIPv4AddressesAndIPv6Slash64s(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 1}, "192.0.2.7/32"},
		{&net.UDPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 2}, "192.0.2.7/32"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 3, Zone: "eth0"}, "2001:db8:1:2::/64"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::1"), Port: 4}, "2001:db8:1:2::/64"},
	} {
		if got := sourceOf(tc.addr).String(); got != tc.want {
			t.Errorf("sourceOf(%s) = %s, want %s", tc.addr, got, tc.want)
		}
	}
	sc := newSourceCounts(2)
	p := sourceOf(&net.TCPAddr{IP: net.ParseIP("192.0.2.7")})
	for i, want := range []bool{true, true, false} {
		if got := sc.take(p); got != want {
			t.Fatalf("take %d from a source of cap 2: %v, want %v", i+1, got, want)
		}
	}
	sc.release(p)
	sc.release(p)
	if len(sc.n) != 0 {
		t.Fatalf("released sources still counted: %v", sc.n)
	}
}
