// Package seal owns sealing secrets at rest: an AEAD (AES-256-GCM) keyed by
// database.postgres.encryptionKey, with every sealed value recording the ID
// of the key that sealed it, so keys listed under previousEncryptionKeys
// still open old rows while new rows use the current key.
//
// A configured key that is 32 random bytes (hex or base64) is expanded with
// HKDF-SHA256; any other key is a passphrase stretched with scrypt and the
// install's salt (kept in Postgres). A key's ID is an HMAC of a fixed label
// under the derived key, so it reveals nothing a guess could be checked
// against faster than the derivation. Rows sealed before this scheme (a
// SHA-256 of the key as AES key, a truncated SHA-256 as ID) still open
// through a legacy opener, and the re-seal on start moves them to the new
// IDs. It never logs and never puts key material or plaintext into errors.
// API: stable.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
)

// ErrUnknownKey means a value was sealed by a key this Keyring does not hold.
var ErrUnknownKey = errors.New("sealed with a key that is not configured (add it to database.postgres.previousEncryptionKeys)")

// ErrOpen means a value failed authentication: wrong key, wrong row or
// tampered bytes.
var ErrOpen = errors.New("sealed value failed authentication")

type key struct {
	id   string
	aead cipher.AEAD
}

// Keyring holds the current key and the previous ones. It is immutable and
// safe for concurrent use.
type Keyring struct {
	current key
	// byID holds every key that opens values: the derived keys, and the
	// legacy derivation of each configured key under its old-style ID.
	byID map[string]key
}

func newAEAD(k []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// NewKeyring builds a keyring sealing with current and opening with current
// and every previous key. salt is the install's salt (see NewSalt); it is
// needed when a key is a passphrase rather than 32 random bytes.
func NewKeyring(salt []byte, current string, previous ...string) (*Keyring, error) {
	if current == "" {
		return nil, errors.New("seal: empty current key")
	}
	kr := &Keyring{byID: map[string]key{}}
	for i, secret := range append([]string{current}, previous...) {
		what := "current key"
		if i > 0 {
			what = fmt.Sprintf("previous key %d", i-1)
		}
		k, err := derive(secret, salt)
		if err != nil {
			return nil, fmt.Errorf("seal: %s: %w", what, err)
		}
		old, err := legacy(secret)
		if err != nil {
			return nil, fmt.Errorf("seal: %s: %w", what, err)
		}
		if i == 0 {
			kr.current = k
		}
		for _, kk := range []key{k, old} {
			if _, dup := kr.byID[kk.id]; !dup {
				kr.byID[kk.id] = kk
			}
		}
	}
	return kr, nil
}

// CurrentID is the ID of the key new values are sealed with.
func (k *Keyring) CurrentID() string { return k.current.id }

// Seal encrypts plaintext with the current key. aad binds the value to its
// place (table, row ID, column) so a sealed value copied elsewhere fails to
// open. It returns the key ID and nonce||ciphertext.
func (k *Keyring) Seal(plaintext, aad []byte) (keyID string, sealed []byte, err error) {
	nonce := make([]byte, k.current.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", nil, fmt.Errorf("seal: nonce: %w", err)
	}
	return k.current.id, k.current.aead.Seal(nonce, nonce, plaintext, aad), nil
}

// Open decrypts a value sealed with the key keyID.
func (k *Keyring) Open(keyID string, sealed, aad []byte) ([]byte, error) {
	kk, ok := k.byID[keyID]
	if !ok {
		return nil, fmt.Errorf("key %s: %w", keyID, ErrUnknownKey)
	}
	n := kk.aead.NonceSize()
	if len(sealed) < n+kk.aead.Overhead() {
		return nil, ErrOpen
	}
	pt, err := kk.aead.Open(nil, sealed[:n], sealed[n:], aad)
	if err != nil {
		return nil, ErrOpen
	}
	return pt, nil
}

// Has reports whether the keyring can open values sealed by keyID.
func (k *Keyring) Has(keyID string) bool {
	_, ok := k.byID[keyID]
	return ok
}
