package enroll

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

// A join token reads l9join_<id>_<secret>: id names the token row (16
// base32 characters) and secret is 256 random bits (52 characters); only the
// secret's SHA-256 is stored.
const (
	joinPrefix    = "l9join"
	joinIDLen     = 16
	joinSecretLen = 52
)

// JoinToken is a parsed join token.
type JoinToken struct {
	ID     string // "jt_…"
	secret string
}

// Hash is the stored form of the token's secret.
func (t JoinToken) Hash() []byte {
	h := sha256.Sum256([]byte(t.secret))
	return h[:]
}

// Matches compares the token with a stored hash in constant time.
func (t JoinToken) Matches(stored []byte) bool {
	return subtle.ConstantTimeCompare(stored, t.Hash()) == 1
}

// MintJoinToken makes a new join token: the row ID, the token to hand out
// once, and the hash to store.
func MintJoinToken() (id, token string, hash []byte) {
	idPart, secret := ids.Random(10), ids.Random(32)
	h := sha256.Sum256([]byte(secret))
	return "jt_" + idPart, joinPrefix + "_" + idPart + "_" + secret, h[:]
}

// ParseJoinToken checks a join token's shape. Errors never quote it.
func ParseJoinToken(s string) (JoinToken, error) {
	parts := strings.Split(strings.TrimSpace(s), "_")
	if len(parts) != 3 || parts[0] != joinPrefix {
		return JoinToken{}, fmt.Errorf("not a levers9 join token (want l9join_<id>_<secret>): %w", errdefs.ErrUnauthenticated)
	}
	if len(parts[1]) != joinIDLen || !ids.IsEncoded(parts[1]) {
		return JoinToken{}, fmt.Errorf("join token id part is malformed: %w", errdefs.ErrUnauthenticated)
	}
	if len(parts[2]) != joinSecretLen || !ids.IsEncoded(parts[2]) {
		return JoinToken{}, fmt.Errorf("join token secret part is malformed: %w", errdefs.ErrUnauthenticated)
	}
	return JoinToken{ID: "jt_" + parts[1], secret: parts[2]}, nil
}

// MaskJoinToken shows a token's ID part and hides its secret, for printing.
func MaskJoinToken(token string) string {
	parts := strings.Split(token, "_")
	if len(parts) != 3 {
		return "l9join_…"
	}
	return parts[0] + "_" + parts[1] + "_" + strings.Repeat("•", 8)
}
