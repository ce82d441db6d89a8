// Package seal owns sealing secrets at rest: an AEAD (AES-256-GCM) keyed by
// database.postgres.encryptionKey, with every sealed value recording the ID
// of the key that sealed it, so keys listed under previousEncryptionKeys
// still open old rows while new rows use the current key. It never logs and
// never puts key material or plaintext into errors. API: stable.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
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
	byID    map[string]key
}

// KeyID is a key's public fingerprint: stable, and reveals nothing useful
// about the key.
func KeyID(secret string) string {
	sum := sha256.Sum256([]byte("levers9 seal key id\x00" + secret))
	return hex.EncodeToString(sum[:8])
}

func newKey(secret string) (key, error) {
	// The configured key is a passphrase of any length; derive 32 bytes.
	k := sha256.Sum256([]byte("levers9 seal key\x00" + secret))
	block, err := aes.NewCipher(k[:])
	if err != nil {
		return key{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return key{}, err
	}
	return key{id: KeyID(secret), aead: aead}, nil
}

// NewKeyring builds a keyring sealing with current and opening with current
// and every previous key.
func NewKeyring(current string, previous ...string) (*Keyring, error) {
	if current == "" {
		return nil, errors.New("seal: empty current key")
	}
	cur, err := newKey(current)
	if err != nil {
		return nil, fmt.Errorf("seal: current key: %w", err)
	}
	kr := &Keyring{current: cur, byID: map[string]key{cur.id: cur}}
	for i, p := range previous {
		k, err := newKey(p)
		if err != nil {
			return nil, fmt.Errorf("seal: previous key %d: %w", i, err)
		}
		if _, dup := kr.byID[k.id]; !dup {
			kr.byID[k.id] = k
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
