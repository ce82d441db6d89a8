// Package auth owns who a caller is: the API token format (parse, mint,
// hash), the gRPC interceptors that authenticate every RPC except health and
// bootstrap and put the caller's Principal in the context, and the
// bootstrap-secret check. It never logs or returns a token secret or the
// bootstrap secret. API: internal to the controlplane.
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

// A token reads levers9_<id>_<secret>: id is the token row's ID without its
// "tok_" prefix (16 base32 characters) and secret is 256 random bits (52
// base32 characters). The ID lets the server find the row; only the
// secret's SHA-256 is stored.
const (
	tokenPrefix = "levers9"
	idLen       = 16
	secretLen   = 52
)

// ParsedToken is a token split into its row ID and secret.
type ParsedToken struct {
	ID     string // "tok_…"
	secret string
}

// Hash is the SHA-256 of the token's secret, as stored.
func (p ParsedToken) Hash() []byte { return HashSecret(p.secret) }

// HashSecret hashes a token secret. The secret has 256 bits of entropy, so
// a plain hash is enough; no password hashing is needed.
func HashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// Mint makes a new token: its ID (for the row), the full token string (to
// show once) and the hash to store.
func Mint() (id, token string, hash []byte) {
	idPart := ids.Random(10)
	secret := ids.Random(32)
	return "tok_" + idPart, tokenPrefix + "_" + idPart + "_" + secret, HashSecret(secret)
}

// ParseToken checks a token's shape. Errors never quote the token.
func ParseToken(s string) (ParsedToken, error) {
	s = strings.TrimSpace(s)
	parts := strings.Split(s, "_")
	if len(parts) != 3 || parts[0] != tokenPrefix {
		return ParsedToken{}, fmt.Errorf("token is not a levers9 token (want levers9_<id>_<secret>): %w", errdefs.ErrUnauthenticated)
	}
	if len(parts[1]) != idLen || !ids.IsEncoded(parts[1]) {
		return ParsedToken{}, fmt.Errorf("token id part is malformed: %w", errdefs.ErrUnauthenticated)
	}
	if len(parts[2]) != secretLen || !ids.IsEncoded(parts[2]) {
		return ParsedToken{}, fmt.Errorf("token secret part is malformed: %w", errdefs.ErrUnauthenticated)
	}
	return ParsedToken{ID: "tok_" + parts[1], secret: parts[2]}, nil
}

// HashMatches compares a stored hash with a parsed token in constant time.
func HashMatches(stored []byte, p ParsedToken) bool {
	return subtle.ConstantTimeCompare(stored, p.Hash()) == 1
}

// SecretMatches compares a presented secret with the configured one in
// constant time (lengths are hashed first so length does not leak either).
func SecretMatches(presented, configured string) bool {
	a := sha256.Sum256([]byte(presented))
	b := sha256.Sum256([]byte(configured))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1 && configured != ""
}
