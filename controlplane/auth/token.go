// Package auth owns who a caller is and what it may do: the API token
// format (parse, mint, hash), the bootstrap-secret check, the one table of
// which token role may call which RPC (roles.go), and the gRPC interceptors
// that authenticate every RPC except health and the public ones, refuse a
// role the table does not list, put the caller's Principal in the context,
// and end open streams whose token is revoked. It never logs or returns a
// token secret or the bootstrap secret. API: internal to the controlplane.
package auth

import (
	"crypto/sha256"

	"github.com/levers9/levers9/internal/ids"
)

// API tokens read levers9_<id>_<secret> (see ids.MintToken); the row ID is
// "tok_" + id.
const tokenPrefix = "levers9"

// ParsedToken is a token split into its row ID and the hash of its secret.
type ParsedToken struct {
	ID   string // "tok_…"
	hash []byte
}

// Hash is the SHA-256 of the token's secret, as stored.
func (p ParsedToken) Hash() []byte { return p.hash }

// Mint makes a new token: its ID (for the row), the full token string (to
// show once) and the hash to store.
func Mint() (id, token string, hash []byte) {
	idPart, token, hash := ids.MintToken(tokenPrefix)
	return "tok_" + idPart, token, hash
}

// ParseToken checks a token's shape. Errors never quote the token.
func ParseToken(s string) (ParsedToken, error) {
	idPart, hash, err := ids.ParseToken(tokenPrefix, "levers9 token", s)
	if err != nil {
		return ParsedToken{}, err
	}
	return ParsedToken{ID: "tok_" + idPart, hash: hash}, nil
}

// HashMatches compares a stored hash with a parsed token in constant time.
func HashMatches(stored []byte, p ParsedToken) bool {
	return ids.HashEqual(stored, p.hash)
}

// SecretMatches compares a presented secret with the configured one in
// constant time (lengths are hashed first so length does not leak either).
func SecretMatches(presented, configured string) bool {
	a := sha256.Sum256([]byte(presented))
	b := sha256.Sum256([]byte(configured))
	return ids.HashEqual(a[:], b[:]) && configured != ""
}
