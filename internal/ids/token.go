package ids

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
)

// Bearer secrets (API tokens, join tokens) read <prefix>_<id>_<secret>: the
// id (16 characters) names the row holding the secret's SHA-256, the secret
// is 256 random bits (52 characters). The secret has full entropy, so a plain
// hash is enough to store.
const (
	tokenIDLen     = 16
	tokenSecretLen = 52
)

// MintToken makes a token with prefix: its id part, the token to show once,
// and the hash to store.
func MintToken(prefix string) (idPart, token string, hash []byte) {
	idPart, secret := Random(10), Random(32)
	h := sha256.Sum256([]byte(secret))
	return idPart, prefix + "_" + idPart + "_" + secret, h[:]
}

// ParseToken checks a token's shape and returns its id part and the hash of
// its secret. what names the token kind in errors, which never quote it.
func ParseToken(prefix, what, s string) (idPart string, hash []byte, err error) {
	parts := strings.Split(strings.TrimSpace(s), "_")
	if len(parts) != 3 || parts[0] != prefix {
		return "", nil, fmt.Errorf("not a %s (want %s_<id>_<secret>): %w", what, prefix, errdefs.ErrUnauthenticated)
	}
	if len(parts[1]) != tokenIDLen || !IsEncoded(parts[1]) {
		return "", nil, fmt.Errorf("%s id part is malformed: %w", what, errdefs.ErrUnauthenticated)
	}
	if len(parts[2]) != tokenSecretLen || !IsEncoded(parts[2]) {
		return "", nil, fmt.Errorf("%s secret part is malformed: %w", what, errdefs.ErrUnauthenticated)
	}
	h := sha256.Sum256([]byte(parts[2]))
	return parts[1], h[:], nil
}

// HashEqual compares two token hashes in constant time.
func HashEqual(a, b []byte) bool { return subtle.ConstantTimeCompare(a, b) == 1 }
