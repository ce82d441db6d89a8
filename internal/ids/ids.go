// Package ids makes the random, prefixed identifiers levers9 gives its
// objects ("ws_…", "tok_…", "sec_…") and the one bearer-secret format that
// API tokens and join tokens share (<prefix>_<id>_<secret>, only the
// secret's hash stored). It holds no state, never returns guessable IDs and
// never quotes a token in an error. API: stable.
package ids

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

var enc = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Random returns n random bytes encoded as lower-case base32.
func Random(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("ids: crypto/rand failed: " + err.Error())
	}
	return enc.EncodeToString(b)
}

// New returns prefix + "_" + 80 random bits (16 characters).
func New(prefix string) string { return prefix + "_" + Random(10) }

// IsEncoded reports whether s uses only the alphabet of Random.
func IsEncoded(s string) bool {
	return s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyz234567") == ""
}
