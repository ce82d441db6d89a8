package agents

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/levers9/levers9/internal/clock"
)

const (
	secretA = "replica-secret-a-0123456789abcdef0123"
	secretB = "replica-secret-b-0123456789abcdef0123"
)

func newTestAuth(t testing.TB, clk clock.Clock, secret string, previous ...string) *replicaAuth {
	t.Helper()
	a, err := newReplicaAuth(secret, previous, clk, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

var testCall = forwardMsg{Kind: kindCall, ID: "fwd_1", From: "rep_a", MachineID: "m_1",
	Method: "/levers9.agent.v1.Agent/RunTask", Payload: []byte{1, 2, 3}, TimeoutMS: 5000}

// TestReplicaMessages: what a receiving replica does with a message, by how
// it was made.
func TestReplicaMessages(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	edit := func(raw []byte, f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	for _, tc := range []struct {
		name string
		// make returns what arrives on rep_b's channel; signer is a replica
		// sharing the receiver's clock.
		make func(signer func(secret string) *replicaAuth, clk *clock.Fake) []byte
		// previous are the receiver's previous secrets (its own is secretA).
		previous []string
		// later moves the receiver's clock after the message was made.
		later  time.Duration
		reason string // "" accepted; else the rejection
		twice  bool   // deliver the same bytes twice: the second is checked
	}{
		{name: "signed", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return encodeForward(s(secretA), "rep_b", testCall)
		}},
		{name: "tampered sealed body", reason: "bad_mac", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return edit(encodeForward(s(secretA), "rep_b", testCall), func(m map[string]any) { m["sealed"] = "BAUG" + m["sealed"].(string)[4:] })
		}},
		{name: "body removed", reason: "bad_mac", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return edit(encodeForward(s(secretA), "rep_b", testCall), func(m map[string]any) { delete(m, "sealed") })
		}},
		{name: "tampered machine", reason: "bad_mac", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return edit(encodeForward(s(secretA), "rep_b", testCall), func(m map[string]any) { m["machine"] = "m_2" })
		}},
		{name: "tampered timestamp", reason: "bad_mac", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return edit(encodeForward(s(secretA), "rep_b", testCall), func(m map[string]any) { m["ts"] = m["ts"].(float64) + 1 })
		}},
		{name: "addressed to another replica", reason: "bad_mac", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return encodeForward(s(secretA), "rep_c", testCall)
		}},
		{name: "no MAC", reason: "bad_mac", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return edit(encodeForward(s(secretA), "rep_b", testCall), func(m map[string]any) { delete(m, "mac") })
		}},
		{name: "wrong key", reason: "bad_mac", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return encodeForward(s(secretB), "rep_b", testCall)
		}},
		{name: "previous key accepted", previous: []string{secretB}, make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return encodeForward(s(secretB), "rep_b", testCall)
		}},
		{name: "just in time", later: replicaWindow - time.Second, make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return encodeForward(s(secretA), "rep_b", testCall)
		}},
		{name: "stale", later: replicaWindow + time.Second, reason: "stale", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return encodeForward(s(secretA), "rep_b", testCall)
		}},
		{name: "from the future", later: -replicaSkew - time.Second, reason: "future", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return encodeForward(s(secretA), "rep_b", testCall)
		}},
		{name: "small skew", later: -replicaSkew + time.Second, make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return encodeForward(s(secretA), "rep_b", testCall)
		}},
		{name: "replayed", twice: true, reason: "replayed", make: func(s func(string) *replicaAuth, _ *clock.Fake) []byte {
			return encodeForward(s(secretA), "rep_b", testCall)
		}},
		{name: "garbage", reason: "malformed", make: func(func(string) *replicaAuth, *clock.Fake) []byte {
			return []byte(`{"kind":`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(start)
			raw := tc.make(func(secret string) *replicaAuth { return newTestAuth(t, clk, secret) }, clk)
			recv := newTestAuth(t, clk, secretA, tc.previous...)
			clk.Advance(tc.later)
			msg, err := decodeForward(recv, "rep_b", raw)
			if tc.twice {
				if err != nil {
					t.Fatalf("first delivery refused: %v", err)
				}
				_, err = decodeForward(recv, "rep_b", raw)
			}
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.reason == "":
				if msg.Kind != testCall.Kind || msg.MachineID != testCall.MachineID || !bytes.Equal(msg.Payload, testCall.Payload) {
					t.Errorf("decoded %+v", msg)
				}
			case err == nil:
				t.Fatalf("accepted, want %s", tc.reason)
			case rejectReason(err) != tc.reason:
				t.Errorf("refused as %s (%v), want %s", rejectReason(err), err, tc.reason)
			}
		})
	}
}

func TestPresenceRecords(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	a := newTestAuth(t, clk, secretA)
	raw := encodePresence(a, "m_1", presenceRecord{Replica: "rep_a", Transport: "quic"})
	// Read many times: no replay check.
	for range 2 {
		if p, err := decodePresence(a, "m_1", raw, time.Minute); err != nil || p.Replica != "rep_a" || p.Transport != "quic" {
			t.Fatalf("own record: %+v, %v", p, err)
		}
	}
	if _, err := decodePresence(a, "m_2", raw, time.Minute); rejectReason(err) != "bad_mac" {
		t.Errorf("a record copied to another machine: %v, want bad_mac", err)
	}
	// The Lua release script reads the replica at the top level.
	var flat struct{ Replica string }
	if err := json.Unmarshal(raw, &flat); err != nil || flat.Replica != "rep_a" {
		t.Errorf("record %s has no top-level replica", raw)
	}
	clk.Advance(time.Minute + time.Second)
	if _, err := decodePresence(a, "m_1", raw, time.Minute); rejectReason(err) != "stale" {
		t.Errorf("a record past its age: %v, want stale", err)
	}
}

// TestNonceSetBounded: past maxNonces the oldest nonces are forgotten, and
// messages as old as them are refused rather than replayable.
func TestNonceSetBounded(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	a := newTestAuth(t, clk, secretA)
	first := a.sign("forward", "x")
	if err := a.open(first, "forward", "x"); err != nil {
		t.Fatal(err)
	}
	for range maxNonces {
		clk.Advance(time.Microsecond) // all well within the window
		s := a.sign("forward", "x")
		if err := a.open(s, "forward", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(a.seen); n > maxNonces {
		t.Fatalf("%d nonces remembered, bound is %d", n, maxNonces)
	}
	if err := a.open(first, "forward", "x"); rejectReason(err) != "stale" {
		t.Errorf("replay of an evicted nonce: %v, want stale", err)
	}
	// Once the window has passed, everything old is forgotten.
	clk.Advance(replicaWindow + time.Second)
	s := a.sign("forward", "x")
	if err := a.open(s, "forward", "x"); err != nil || len(a.seen) != 1 {
		t.Errorf("after the window: %v, %d nonces", err, len(a.seen))
	}
}

// TestRejectionsCountedAndWarnedOncePerMinute: per reason.
func TestRejectionsCountedAndWarnedOncePerMinute(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	var logs bytes.Buffer
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rejected"}, []string{"reason"})
	a, err := newReplicaAuth(secretA, nil, clk, slog.New(slog.NewJSONHandler(&logs, nil)), counter)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		_, err := decodeForward(a, "rep_b", []byte(`{"kind":"call"}`))
		a.reject("test", err)
	}
	_, err = decodeForward(a, "rep_b", []byte(`nonsense`))
	a.reject("test", err) // another reason: warned at once
	clk.Advance(warnEvery)
	_, err = decodeForward(a, "rep_b", []byte(`{"kind":"call"}`))
	a.reject("test", err)
	if got := testutil.ToFloat64(counter.WithLabelValues("bad_mac")); got != 6 {
		t.Errorf("bad_mac counted %v times, want 6", got)
	}
	if got := testutil.ToFloat64(counter.WithLabelValues("malformed")); got != 1 {
		t.Errorf("malformed counted %v times, want 1", got)
	}
	if n := bytes.Count(logs.Bytes(), []byte("refused a replica message")); n != 3 {
		t.Errorf("%d warnings, want 3 (one per minute and reason):\n%s", n, logs.String())
	}
	if !bytes.Contains(logs.Bytes(), []byte(`"refused":5`)) {
		t.Errorf("the second warning does not count what it held back:\n%s", logs.String())
	}
	if bytes.Contains(logs.Bytes(), []byte(secretA)) {
		t.Error("the secret was logged")
	}
}

// FuzzDecodeForward: the decoder never panics, and it accepts nothing but
// the messages a key holder signed, each once.
func FuzzDecodeForward(f *testing.F) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	signer := newTestAuth(f, clock.NewFake(now), secretA)
	signed := encodeForward(signer, "rep_b", testCall)
	f.Add(signed)
	f.Add(encodeForward(signer, "rep_b", forwardMsg{Kind: kindPing, ID: "fwd_2", From: "rep_a"}))
	f.Add(encodePresence(signer, "m_1", presenceRecord{Replica: "rep_a", Transport: "quic"}))
	f.Add([]byte(`{"kind":"call","ts":1,"nonce":"","mac":"AAAA"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		recv := newTestAuth(t, clock.NewFake(now), secretA)
		msg, err := decodeForward(recv, "rep_b", raw)
		if err == nil {
			// Only a signer could have made it: re-signing its fields with
			// its stamp gives the same MAC.
			if got := macOf(recv.keys[0], forwardPurpose, msg.TS, msg.Nonce, msg.fields("rep_b")); !bytes.Equal(got, mustB64(t, msg.MAC)) {
				t.Fatalf("accepted %q with a MAC that does not match", raw)
			}
			if _, err := decodeForward(recv, "rep_b", raw); err == nil {
				t.Fatalf("accepted %q twice", raw)
			}
		}
		if _, err := decodePresence(recv, "m_1", raw, time.Minute); err != nil && rejectReason(err) == "" {
			t.Fatalf("no reason for %v", err)
		}
	})
}

func mustB64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.RawStdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
