package enroll

import (
	"strings"

	"github.com/levers9/levers9/internal/ids"
)

// Join tokens read l9join_<id>_<secret> (see ids.MintToken); the row ID is
// "jt_" + id.
const joinPrefix = "l9join"

// JoinToken is a parsed join token.
type JoinToken struct {
	ID   string // "jt_…"
	hash []byte
}

// Hash is the stored form of the token's secret.
func (t JoinToken) Hash() []byte { return t.hash }

// Matches compares the token with a stored hash in constant time.
func (t JoinToken) Matches(stored []byte) bool { return ids.HashEqual(stored, t.hash) }

// MintJoinToken makes a new join token: the row ID, the token to hand out
// once, and the hash to store.
func MintJoinToken() (id, token string, hash []byte) {
	idPart, token, hash := ids.MintToken(joinPrefix)
	return "jt_" + idPart, token, hash
}

// ParseJoinToken checks a join token's shape. Errors never quote it.
func ParseJoinToken(s string) (JoinToken, error) {
	idPart, hash, err := ids.ParseToken(joinPrefix, "levers9 join token", s)
	if err != nil {
		return JoinToken{}, err
	}
	return JoinToken{ID: "jt_" + idPart, hash: hash}, nil
}

// MaskJoinToken shows a token's ID part and hides its secret, for printing.
func MaskJoinToken(token string) string {
	parts := strings.Split(token, "_")
	if len(parts) != 3 {
		return "l9join_…"
	}
	return parts[0] + "_" + parts[1] + "_" + strings.Repeat("•", 8)
}
