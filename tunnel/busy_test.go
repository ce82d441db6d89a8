package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"
)

// tlsClientAgainst runs a TLS client handshake against a peer that answers
// with first and then closes, as the server's refuseBusy does.
func tlsClientAgainst(t testing.TB, first []byte) error {
	t.Helper()
	c, s := net.Pipe()
	go func() {
		defer s.Close()
		_ = s.SetDeadline(time.Now().Add(2 * time.Second))
		go func() { _, _ = io.Copy(io.Discard, s) }()
		_, _ = s.Write(first)
	}()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return tls.Client(c, &tls.Config{ServerName: "levers9"}).HandshakeContext(ctx)
}

func TestBusyRecordReachesTheTLSClient(t *testing.T) {
	for _, tc := range []struct {
		hint, want time.Duration
	}{
		{250 * time.Millisecond, 250 * time.Millisecond},
		{1234 * time.Millisecond, 1230 * time.Millisecond}, // 10 ms units
		{0, busyUnit},                      // never "come back at once"
		{5 * time.Minute, maxRetryAfter},   // capped
		{-time.Second, busyUnit},           // clamped
		{maxRetryAfter, maxRetryAfter},     // the cap itself fits 16 bits
		{655 * time.Second, maxRetryAfter}, // would overflow 16 bits unclamped
		{time.Duration(1 << 62), maxRetryAfter},
	} {
		err := tlsClientAgainst(t, encodeBusy(tc.hint))
		r, ok := busyRefusal(err)
		if !ok {
			t.Fatalf("hint %s: client error %v not recognised as busy", tc.hint, err)
		}
		if r.RetryAfter != tc.want {
			t.Errorf("hint %s arrived as %s, want %s", tc.hint, r.RetryAfter, tc.want)
		}
	}
}

func TestBusyRefusalIgnoresOtherFailures(t *testing.T) {
	for name, first := range map[string][]byte{
		"closed at once":   nil,
		"plain HTTP":       []byte("HTTP/1.1 400 Bad Request\r\n\r\n"),
		"short busy":       busyMagic[:],
		"tunnel hello":     helloMagic[:],
		"TLS alert record": {21, 3, 3, 0, 2, 2, 40},
	} {
		err := tlsClientAgainst(t, first)
		if err == nil {
			t.Fatalf("%s: handshake succeeded", name)
		}
		if r, ok := busyRefusal(err); ok {
			t.Errorf("%s: %v taken for a busy refusal %v", name, err, r)
		}
	}
}

func TestAdmissionBusyJoinsTheQueue(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAdmission(100, 10, now)
	// Tokens left: the hint is still the floor, as the handshakes in
	// flight need time to finish.
	if got := a.busy(now); got != minBusyWait {
		t.Fatalf("busy with tokens left: %s, want %s", got, minBusyWait)
	}
	// Busy refusals queue like rate refusals: 200 of them at 100/s put the
	// last about 2 s out, and an admission after them is queued behind.
	var last time.Duration
	for range 200 {
		last = a.busy(now)
	}
	if last < 1800*time.Millisecond || last > 2200*time.Millisecond {
		t.Fatalf("200th busy hint %s, want about 2 s", last)
	}
	a.tokens = 0
	if ok, wait := a.admit(now); ok || wait < last {
		t.Fatalf("admission after the busy queue: ok=%v wait=%s, want refused behind %s", ok, wait, last)
	}
}

func FuzzBusyRecord(f *testing.F) {
	f.Add(encodeBusy(time.Second))
	f.Add([]byte{'L', '9', 'B', 0xff, 0xff})
	f.Add([]byte{22, 3, 3, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, first []byte) {
		err := tlsClientAgainst(t, first)
		r, ok := busyRefusal(err)
		if !ok {
			return
		}
		if !bytes.HasPrefix(first, busyMagic[:]) || len(first) < 5 {
			t.Fatalf("%q taken for a busy record", first)
		}
		if r.RetryAfter < 0 || r.RetryAfter > maxRetryAfter {
			t.Fatalf("%q gave hint %s outside [0, %s]", first, r.RetryAfter, maxRetryAfter)
		}
	})
}
