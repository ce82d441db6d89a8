package tunnel

import (
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
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
