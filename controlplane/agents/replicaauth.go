package agents

import (
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/levers9/levers9/internal/clock"
)

// Replica messages are authenticated. Anything a replica reads from Redis
// that another replica wrote (forwarded calls and their replies, drops,
// pings, presence records) carries a stamp:
//
//	"ts":    the signer's clock, Unix milliseconds
//	"nonce": 16 random bytes, base64
//	"mac":   HMAC-SHA256 over the purpose, ts, nonce and the message's
//	         fields (each length-prefixed), base64
//
// The MAC key is HKDF-SHA256 of a replica secret with macLabel; the first
// secret signs, every one verifies (rotation). A message is refused when its
// MAC does not match (bad_mac), it is older than the window (stale) or from
// further ahead than the skew (future), or its nonce was seen within the
// window (replayed). Presence records are read many times, so they skip the
// nonce check and use a window of their own (their refresh period).
//
// Forwarded calls and replies also seal their body (forwardseal.go) under a
// key derived from the same secrets with another label; the MAC covers the
// ciphertext.
//
// The nonce set is bounded: past maxNonces the oldest entries are evicted
// and messages no newer than the newest evicted one are refused as stale,
// so a nonce that is no longer remembered can never be replayed.

const (
	macLabel = "levers9 replica messages v1"
	// replicaWindow is how old a message may be.
	replicaWindow = 30 * time.Second
	// replicaSkew is how far ahead of this replica's clock a signer's may be.
	replicaSkew = 5 * time.Second
	maxNonces   = 1 << 17
	// warnEvery limits the warning about rejected messages.
	warnEvery = time.Minute
)

// stamp authenticates one replica message; it is embedded in the message's
// JSON.
type stamp struct {
	TS    int64  `json:"ts,omitempty"`
	Nonce string `json:"nonce,omitempty"`
	MAC   string `json:"mac,omitempty"`
}

// rejection is why a message was refused; reason is the metric label, from
// the sending replica when the message says (old_version, unknown_version,
// bad_seal).
type rejection struct{ reason, from string }

func (r *rejection) Error() string { return "replica message refused: " + r.reason }

// rejectReason is the label for err (malformed when it is not a rejection).
func rejectReason(err error) string {
	var r *rejection
	if errors.As(err, &r) {
		return r.reason
	}
	return "malformed"
}

type nonceEntry struct {
	nonce string
	ts    int64
}

// replicaAuth signs and checks replica messages. Safe for concurrent use.
type replicaAuth struct {
	keys [][]byte
	// sealers seal forwarded bodies (forwardseal.go), one per secret like
	// keys.
	sealers  []cipher.AEAD
	clock    clock.Clock
	log      *slog.Logger
	rejected *prometheus.CounterVec

	// mu guards the fields below.
	mu    sync.Mutex
	seen  map[string]struct{}
	order []nonceEntry
	// floor: messages stamped at or before it are stale (nonces evicted).
	floor int64
	// lastWarn and quiet rate-limit the warning per reason; quiet counts
	// rejections since it.
	lastWarn map[string]time.Time
	quiet    map[string]int
}

// macKey derives the MAC key of one replica secret.
func macKey(secret string) ([]byte, error) {
	return hkdf.Key(sha256.New, []byte(secret), nil, macLabel, 32)
}

func newReplicaAuth(secret string, previous []string, clk clock.Clock, log *slog.Logger, rejected *prometheus.CounterVec) (*replicaAuth, error) {
	if secret == "" {
		return nil, errors.New("agents: a replica secret is required (controlplane.replicaSecret, or the encryption key it defaults to)")
	}
	a := &replicaAuth{clock: clock.OrReal(clk), log: log, rejected: rejected, seen: map[string]struct{}{},
		lastWarn: map[string]time.Time{}, quiet: map[string]int{}}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	for _, s := range append([]string{secret}, previous...) {
		k, err := macKey(s)
		if err != nil {
			return nil, fmt.Errorf("agents: derive the replica MAC key: %w", err)
		}
		a.keys = append(a.keys, k)
	}
	var err error
	if a.sealers, err = newSealers(append([]string{secret}, previous...)); err != nil {
		return nil, fmt.Errorf("agents: %w", err)
	}
	return a, nil
}

func macOf(key []byte, purpose string, ts int64, nonce string, fields []string) []byte {
	m := hmac.New(sha256.New, key)
	var n [binary.MaxVarintLen64]byte
	for _, f := range append([]string{purpose, strconv.FormatInt(ts, 10), nonce}, fields...) {
		m.Write(n[:binary.PutUvarint(n[:], uint64(len(f)))])
		m.Write([]byte(f))
	}
	return m.Sum(nil)
}

// sign stamps a message of purpose made of fields, with the current key.
func (a *replicaAuth) sign(purpose string, fields ...string) stamp {
	var nb [16]byte
	_, _ = rand.Read(nb[:])
	s := stamp{TS: a.clock.Now().UnixMilli(), Nonce: base64.RawStdEncoding.EncodeToString(nb[:])}
	s.MAC = base64.RawStdEncoding.EncodeToString(macOf(a.keys[0], purpose, s.TS, s.Nonce, fields))
	return s
}

// verify checks the MAC and the age (at most maxAge, at most replicaSkew
// ahead); it does not look at the nonce.
func (a *replicaAuth) verify(s stamp, maxAge time.Duration, purpose string, fields ...string) error {
	got, err := base64.RawStdEncoding.DecodeString(s.MAC)
	if err != nil || len(got) != sha256.Size || s.Nonce == "" {
		return &rejection{reason: "bad_mac"}
	}
	ok := false
	for _, k := range a.keys {
		if hmac.Equal(got, macOf(k, purpose, s.TS, s.Nonce, fields)) {
			ok = true
			break
		}
	}
	if !ok {
		return &rejection{reason: "bad_mac"}
	}
	now := a.clock.Now().UnixMilli()
	switch {
	case s.TS > now+replicaSkew.Milliseconds():
		return &rejection{reason: "future"}
	case s.TS < now-maxAge.Milliseconds():
		return &rejection{reason: "stale"}
	}
	return nil
}

// open checks a message that must be seen once: MAC, age within
// replicaWindow, and a nonce not seen before (which it then remembers).
func (a *replicaAuth) open(s stamp, purpose string, fields ...string) error {
	if err := a.verify(s, replicaWindow, purpose, fields...); err != nil {
		return err
	}
	now := a.clock.Now().UnixMilli()
	a.mu.Lock()
	defer a.mu.Unlock()
	// Forget nonces too old to be accepted again anyway.
	for len(a.order) > 0 && a.order[0].ts < now-replicaWindow.Milliseconds() {
		delete(a.seen, a.order[0].nonce)
		a.order = a.order[1:]
	}
	if s.TS <= a.floor {
		return &rejection{reason: "stale"}
	}
	if _, dup := a.seen[s.Nonce]; dup {
		return &rejection{reason: "replayed"}
	}
	for len(a.order) >= maxNonces {
		a.floor = max(a.floor, a.order[0].ts)
		delete(a.seen, a.order[0].nonce)
		a.order = a.order[1:]
	}
	a.seen[s.Nonce] = struct{}{}
	a.order = append(a.order, nonceEntry{s.Nonce, s.TS})
	return nil
}

// rejectWarnings says, per reason, why a message was refused and what to do.
var rejectWarnings = map[string]string{
	"old_version":     "refused a message from a replica running an older levers9 (its forwarded calls are not encrypted): finish upgrading every replica; until then pushes forwarded between old and new replicas fail",
	"unknown_version": "refused a replica message in a newer format than this replica's: upgrade this replica; until then pushes forwarded between old and new replicas fail",
	"bad_seal":        "refused a replica message from Redis: its encrypted body did not open (tampered, moved from another message, or sealed with another controlplane.replicaSecret)",
}

// reject counts a refused message and warns at most once per warnEvery and
// reason. The warning never holds the message's bytes.
func (a *replicaAuth) reject(what string, err error) {
	reason := rejectReason(err)
	if a.rejected != nil {
		a.rejected.WithLabelValues(reason).Inc()
	}
	a.mu.Lock()
	a.quiet[reason]++
	now := a.clock.Now()
	if last, ok := a.lastWarn[reason]; ok && now.Sub(last) < warnEvery {
		a.mu.Unlock()
		return
	}
	n := a.quiet[reason]
	a.lastWarn[reason], a.quiet[reason] = now, 0
	a.mu.Unlock()
	msg, ok := rejectWarnings[reason]
	if !ok {
		msg = "refused a replica message from Redis: forged, stale or replayed, or a replica with another controlplane.replicaSecret"
	}
	args := []any{"what", what, "reason", reason, "refused", n, "audit", true}
	var r *rejection
	if errors.As(err, &r) && r.from != "" {
		args = append(args, "replica", r.from)
	}
	a.log.Warn(msg, args...)
}
