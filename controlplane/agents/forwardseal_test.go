package agents

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/clock"
)

// secretBody is a payload holding something that must never travel in
// clear.
var secretBody = []byte("registry-password-0xC0FFEE and DB_PASSWORD=hunter2")

// craft is encodeForward with the sealing taken apart: the body is sealed
// by sealer for the header that adOf makes of msg (and addressee to), and
// the message is signed by signer, so a test can feed the AEAD what a
// signer could but a well-behaved replica never would.
func craft(signer, sealer *replicaAuth, to string, msg forwardMsg, adOf func(m forwardMsg, to string) (forwardMsg, string)) []byte {
	msg.V = forwardVersion
	adMsg, adTo := msg, to
	if adOf != nil {
		adMsg, adTo = adOf(msg, to)
	}
	msg.Sealed = sealer.sealBody(lengthPrefixed(adMsg.header(adTo)...), msg.body())
	msg.stamp = signer.sign(forwardPurpose, msg.fields(to)...)
	b, _ := json.Marshal(msg)
	return b
}

// TestForwardedBodiesAreSealed: what a replica does with a sealed call, by
// how its body was sealed.
func TestForwardedBodiesAreSealed(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	call := testCall
	call.Payload = secretBody
	reply := forwardMsg{Kind: kindReply, ID: "fwd_1", From: "rep_b", Payload: secretBody, Code: 9, Message: "refused: " + string(secretBody)}
	for _, tc := range []struct {
		name   string
		msg    forwardMsg
		make   func(a, b *replicaAuth, msg forwardMsg) []byte // a: secretA, b: secretB
		reason string
	}{
		{name: "sealed call", msg: call, make: func(a, _ *replicaAuth, m forwardMsg) []byte { return encodeForward(a, "rep_b", m) }},
		{name: "sealed reply", msg: reply, make: func(a, _ *replicaAuth, m forwardMsg) []byte { return encodeForward(a, "rep_b", m) }},
		{name: "no body", msg: forwardMsg{Kind: kindCall, ID: "fwd_1", From: "rep_a", MachineID: "m_1", Method: call.Method},
			make: func(a, _ *replicaAuth, m forwardMsg) []byte { return encodeForward(a, "rep_b", m) }},
		{name: "tampered ciphertext, MAC signed over it", msg: call, reason: "bad_seal", make: func(a, _ *replicaAuth, m forwardMsg) []byte {
			var w forwardMsg
			_ = json.Unmarshal(encodeForward(a, "rep_b", m), &w)
			w.Sealed[len(w.Sealed)-20] ^= 1
			w.stamp = a.sign(forwardPurpose, w.fields("rep_b")...)
			b, _ := json.Marshal(w)
			return b
		}},
		{name: "truncated ciphertext", msg: call, reason: "bad_seal", make: func(a, _ *replicaAuth, m forwardMsg) []byte {
			var w forwardMsg
			_ = json.Unmarshal(encodeForward(a, "rep_b", m), &w)
			w.Sealed = w.Sealed[:10]
			w.stamp = a.sign(forwardPurpose, w.fields("rep_b")...)
			b, _ := json.Marshal(w)
			return b
		}},
		{name: "crafted as a replica would", msg: call, make: func(a, _ *replicaAuth, m forwardMsg) []byte {
			return craft(a, a, "rep_b", m, nil)
		}},
		{name: "sealed with another secret's key", msg: call, reason: "bad_seal", make: func(a, b *replicaAuth, m forwardMsg) []byte {
			return craft(a, b, "rep_b", m, nil)
		}},
		{name: "sealed for another machine", msg: call, reason: "bad_seal", make: func(a, _ *replicaAuth, m forwardMsg) []byte {
			return craft(a, a, "rep_b", m, func(m forwardMsg, to string) (forwardMsg, string) { m.MachineID = "m_2"; return m, to })
		}},
		{name: "sealed for another method", msg: call, reason: "bad_seal", make: func(a, _ *replicaAuth, m forwardMsg) []byte {
			return craft(a, a, "rep_b", m, func(m forwardMsg, to string) (forwardMsg, string) {
				m.Method = "/levers9.agent.v1.Agent/CancelTask"
				return m, to
			})
		}},
		{name: "sealed for another call", msg: call, reason: "bad_seal", make: func(a, _ *replicaAuth, m forwardMsg) []byte {
			return craft(a, a, "rep_b", m, func(m forwardMsg, to string) (forwardMsg, string) { m.ID = "fwd_2"; return m, to })
		}},
		{name: "sealed as a reply", msg: call, reason: "bad_seal", make: func(a, _ *replicaAuth, m forwardMsg) []byte {
			return craft(a, a, "rep_b", m, func(m forwardMsg, to string) (forwardMsg, string) { m.Kind = kindReply; return m, to })
		}},
		{name: "sealed for another replica", msg: call, reason: "bad_seal", make: func(a, _ *replicaAuth, m forwardMsg) []byte {
			return craft(a, a, "rep_b", m, func(m forwardMsg, _ string) (forwardMsg, string) { return m, "rep_c" })
		}},
		{name: "a v1 message (body in clear)", msg: call, reason: "old_version", make: func(a, _ *replicaAuth, m forwardMsg) []byte {
			m.V1Payload = m.Payload
			m.stamp = a.sign(forwardPurpose, m.v1Fields("rep_b")...)
			raw, _ := json.Marshal(m)
			return raw
		}},
		{name: "a forged v1 message", msg: call, reason: "bad_mac", make: func(_, b *replicaAuth, m forwardMsg) []byte {
			m.V1Payload = m.Payload
			m.stamp = b.sign(forwardPurpose, m.v1Fields("rep_b")...)
			raw, _ := json.Marshal(m)
			return raw
		}},
		{name: "a newer format", msg: call, reason: "unknown_version", make: func(a, _ *replicaAuth, m forwardMsg) []byte {
			var w map[string]any
			_ = json.Unmarshal(encodeForward(a, "rep_b", m), &w)
			w["v"] = forwardVersion + 1
			raw, _ := json.Marshal(w)
			return raw
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(start)
			a, b := newTestAuth(t, clk, secretA), newTestAuth(t, clk, secretB)
			raw := tc.make(a, b, tc.msg)
			if bytes.Contains(raw, secretBody) || bytes.Contains(raw, []byte(base64.StdEncoding.EncodeToString(secretBody))) {
				if tc.reason != "old_version" && tc.reason != "bad_mac" {
					t.Fatalf("the body is on the wire in clear: %s", raw)
				}
			}
			var logs bytes.Buffer
			recv, err := newReplicaAuth(secretA, nil, clk, slog.New(slog.NewJSONHandler(&logs, nil)), nil)
			if err != nil {
				t.Fatal(err)
			}
			msg, err := decodeForward(recv, "rep_b", raw)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.reason == "":
				if !bytes.Equal(msg.Payload, tc.msg.Payload) || msg.Message != tc.msg.Message || msg.Code != tc.msg.Code ||
					msg.MachineID != tc.msg.MachineID || msg.Method != tc.msg.Method {
					t.Errorf("opened %+v, want %+v", msg, tc.msg)
				}
				return
			case err == nil:
				t.Fatalf("accepted, want %s", tc.reason)
			case rejectReason(err) != tc.reason:
				t.Fatalf("refused as %s (%v), want %s", rejectReason(err), err, tc.reason)
			}
			recv.reject("replica channel", err)
			if !bytes.Contains(logs.Bytes(), []byte(`"reason":"`+tc.reason+`"`)) {
				t.Errorf("no warning naming %s:\n%s", tc.reason, logs.String())
			}
			if bytes.Contains(logs.Bytes(), secretBody[:16]) || bytes.Contains(logs.Bytes(), []byte(base64.StdEncoding.EncodeToString(secretBody)[:16])) {
				t.Errorf("the body reached the log:\n%s", logs.String())
			}
			if tc.reason == "old_version" && !bytes.Contains(logs.Bytes(), []byte("older levers9")) {
				t.Errorf("the warning does not say the peer is older:\n%s", logs.String())
			}
		})
	}
}

// TestSealBody: the AEAD alone refuses a tampered ciphertext, a wrong key
// and other associated data, and opens with a previous secret's key.
func TestSealBody(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	a, b := newTestAuth(t, clk, secretA), newTestAuth(t, clk, secretB)
	ad := lengthPrefixed("v2", "rep_b", kindCall, "fwd_1", "rep_a", "m_1", testCall.Method, "5000", "0")
	sealed := a.sealBody(ad, secretBody)
	if again := a.sealBody(ad, secretBody); bytes.Equal(sealed[:24], again[:24]) || bytes.Equal(sealed, again) {
		t.Error("two seals of the same body share a nonce")
	}
	if body, err := a.openBody(ad, sealed); err != nil || !bytes.Equal(body, secretBody) {
		t.Fatalf("open: %q, %v", body, err)
	}
	for i := range sealed {
		bad := bytes.Clone(sealed)
		bad[i] ^= 0x80
		if _, err := a.openBody(ad, bad); err == nil {
			t.Fatalf("opened with byte %d flipped", i)
		}
	}
	if _, err := b.openBody(ad, sealed); err == nil {
		t.Error("opened with another secret's key")
	}
	swapped := lengthPrefixed("v2", "rep_b", kindCall, "fwd_1", "rep_a", "m_2", testCall.Method, "5000", "0")
	if _, err := a.openBody(swapped, sealed); err == nil {
		t.Error("opened with another machine in the associated data")
	}
	// Length prefixes keep field boundaries: moving a character across
	// them changes the associated data.
	shifted := lengthPrefixed("v2", "rep_b", kindCall, "fwd_1", "rep_a", "m_", "1"+testCall.Method, "5000", "0")
	if _, err := a.openBody(shifted, sealed); err == nil {
		t.Error("opened with a field boundary moved")
	}
	if _, err := a.openBody(ad, nil); err == nil {
		t.Error("opened nothing")
	}
	rotated := newTestAuth(t, clk, secretB, secretA)
	if body, err := rotated.openBody(ad, sealed); err != nil || !bytes.Equal(body, secretBody) {
		t.Errorf("a replica with the sealing secret as its previous one: %v", err)
	}
	if _, err := rotated.openBody(ad, rotated.sealBody(ad, secretBody)); err != nil {
		t.Errorf("own seal: %v", err)
	}
	// The sealing key is not the MAC key.
	k, _ := sealKey(secretA)
	if bytes.Equal(k, a.keys[0]) {
		t.Error("the sealing key equals the MAC key")
	}
}
