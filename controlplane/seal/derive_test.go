package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
)

var testSalt = bytes.Repeat([]byte{7}, SaltLen)

// TestRandomKeyUsesHKDF: a key of 32 random bytes, in hex or base64, is
// expanded with HKDF-SHA256 (no salt needed), and its ID is the HMAC of the
// fixed label under the derived key, computed here from the standard library.
func TestRandomKeyUsesHKDF(t *testing.T) {
	t.Parallel()
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	master, _ := hkdf.Key(sha256.New, raw, nil, "levers9 seal master key v2", 32)
	mac := hmac.New(sha256.New, master)
	mac.Write([]byte("levers9 seal key id v2"))
	wantID := "k2-" + hex.EncodeToString(mac.Sum(nil)[:12])
	for _, enc := range []string{hex.EncodeToString(raw), base64.StdEncoding.EncodeToString(raw),
		base64.RawURLEncoding.EncodeToString(raw)} {
		kr, err := NewKeyring(nil, enc)
		if err != nil {
			t.Fatalf("%s: %v", enc, err)
		}
		if kr.CurrentID() != wantID {
			t.Errorf("%s: id %s, want %s", enc, kr.CurrentID(), wantID)
		}
	}
	if strings.Contains(wantID, hex.EncodeToString(raw)[:8]) {
		t.Error("id holds key bytes")
	}
}

// TestPassphraseUsesSalt: a passphrase needs the install's salt, and the
// same passphrase under two salts is two different keys.
func TestPassphraseUsesSalt(t *testing.T) {
	t.Parallel()
	const pass = "a passphrase, not random bytes"
	if _, err := NewKeyring(nil, pass); err == nil || strings.Contains(err.Error(), pass) {
		t.Fatalf("a passphrase without salt: %v", err)
	}
	a, err := NewKeyring(testSalt, pass)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewSalt()
	b, err := NewKeyring(other, pass)
	if err != nil {
		t.Fatal(err)
	}
	if a.CurrentID() == b.CurrentID() {
		t.Error("two salts, one key id")
	}
	id, sealed, _ := a.Seal([]byte("x"), nil)
	if _, err := b.Open(id, sealed, nil); err == nil {
		t.Error("a value sealed under one install's salt opened under another's")
	}
	sum := sha256.Sum256([]byte("levers9 seal key id\x00" + pass))
	if strings.Contains(a.CurrentID(), hex.EncodeToString(sum[:8])) {
		t.Error("the new id is the old hash of the key")
	}
}

// TestLegacyRowsOpen: values sealed by the old derivation open under their
// old-style ID, and sealing always uses the new key.
func TestLegacyRowsOpen(t *testing.T) {
	t.Parallel()
	const pass = "legacy-passphrase-aaaaaaaaaaaaaa"
	k := sha256.Sum256([]byte("levers9 seal key\x00" + pass))
	block, _ := aes.NewCipher(k[:])
	aead, _ := cipher.NewGCM(block)
	nonce := make([]byte, aead.NonceSize())
	old := aead.Seal(nonce, nonce, []byte("old secret"), []byte("aad"))
	sum := sha256.Sum256([]byte("levers9 seal key id\x00" + pass))
	oldID := hex.EncodeToString(sum[:8])

	kr, err := NewKeyring(testSalt, "new-current-passphrase-bbbbbbbbb", pass)
	if err != nil {
		t.Fatal(err)
	}
	if pt, err := kr.Open(oldID, old, []byte("aad")); err != nil || string(pt) != "old secret" {
		t.Fatalf("legacy row: %q %v", pt, err)
	}
	if id, _, _ := kr.Seal([]byte("y"), nil); id == oldID || !strings.HasPrefix(id, "k2-") {
		t.Errorf("sealed under %s", id)
	}
}
