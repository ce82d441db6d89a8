package seal

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/scrypt"
)

// Labels bind each derived value to its use; changing one changes every key
// ID and strands every row, so they never change.
const (
	hkdfInfo    = "levers9 seal master key v2"
	aeadInfo    = "levers9 seal aes-256-gcm v2"
	keyIDLabel  = "levers9 seal key id v2"
	keyIDPrefix = "k2-"
	// scrypt cost: about 50-100 ms and 32 MiB for each configured
	// passphrase key, once per start.
	scryptN, scryptR, scryptP = 1 << 15, 8, 1
	// SaltLen is the length of an install's salt.
	SaltLen = 32
)

// NewSalt makes an install's salt.
func NewSalt() ([]byte, error) {
	s := make([]byte, SaltLen)
	if _, err := rand.Read(s); err != nil {
		return nil, fmt.Errorf("seal: salt: %w", err)
	}
	return s, nil
}

// randomKey returns the 32 bytes a key encodes in hex or base64 (standard
// or URL alphabet, padded or not), or nil when it is a passphrase.
func randomKey(secret string) []byte {
	s := strings.TrimSpace(secret)
	if b, err := hex.DecodeString(s); err == nil && len(b) == 32 {
		return b
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil && len(b) == 32 {
			return b
		}
	}
	return nil
}

// derive makes the key a configured secret stands for: HKDF-SHA256 of 32
// random bytes, or scrypt of a passphrase with the install's salt. Its ID is
// HMAC-SHA256(master, keyIDLabel), and the AEAD key is expanded from the
// master key apart from it.
func derive(secret string, salt []byte) (key, error) {
	var master []byte
	if raw := randomKey(secret); raw != nil {
		m, err := hkdf.Key(sha256.New, raw, nil, hkdfInfo, 32)
		if err != nil {
			return key{}, err
		}
		master = m
	} else {
		if len(salt) < 16 {
			return key{}, errors.New("a passphrase key needs the install's salt")
		}
		m, err := scrypt.Key([]byte(secret), salt, scryptN, scryptR, scryptP, 32)
		if err != nil {
			return key{}, err
		}
		master = m
	}
	defer clear(master)
	aeadKey, err := hkdf.Expand(sha256.New, master, aeadInfo, 32)
	if err != nil {
		return key{}, err
	}
	defer clear(aeadKey)
	aead, err := newAEAD(aeadKey)
	if err != nil {
		return key{}, err
	}
	mac := hmac.New(sha256.New, master)
	mac.Write([]byte(keyIDLabel))
	return key{id: keyIDPrefix + hex.EncodeToString(mac.Sum(nil)[:12]), aead: aead}, nil
}

// legacy is the derivation rows were sealed with before derive: it only
// opens them, under their old-style ID (16 hex digits), until the re-seal
// moves them.
func legacy(secret string) (key, error) {
	k := sha256.Sum256([]byte("levers9 seal key\x00" + secret))
	defer clear(k[:])
	aead, err := newAEAD(k[:])
	if err != nil {
		return key{}, err
	}
	id := sha256.Sum256([]byte("levers9 seal key id\x00" + secret))
	return key{id: hex.EncodeToString(id[:8]), aead: aead}, nil
}
