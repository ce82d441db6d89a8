package seal

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestSealOpenRotate(t *testing.T) {
	t.Parallel()
	a, err := NewKeyring(testSalt, "key-a-aaaaaaaaaaaaaaaa")
	if err != nil {
		t.Fatal(err)
	}
	aad := []byte("secrets/sec_1/value")
	id, sealed, err := a.Seal([]byte("s3cr3t"), aad)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("s3cr3t")) {
		t.Fatal("plaintext visible in sealed bytes")
	}
	b, _ := NewKeyring(testSalt, "key-b-bbbbbbbbbbbbbbbb", "key-a-aaaaaaaaaaaaaaaa")
	if b.CurrentID() == id {
		t.Fatal("rotation must change the key id")
	}
	pt, err := b.Open(id, sealed, aad)
	if err != nil || string(pt) != "s3cr3t" {
		t.Fatalf("previous key must open: %q %v", pt, err)
	}
	onlyB, _ := NewKeyring(testSalt, "key-b-bbbbbbbbbbbbbbbb")
	if _, err := onlyB.Open(id, sealed, aad); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("dropped key: err = %v, want ErrUnknownKey", err)
	}
	if _, err := a.Open(id, sealed, []byte("secrets/sec_2/value")); !errors.Is(err, ErrOpen) {
		t.Errorf("moved row: err = %v, want ErrOpen", err)
	}
	tampered := append([]byte(nil), sealed...)
	tampered[len(tampered)-1] ^= 1
	if _, err := a.Open(id, tampered, aad); !errors.Is(err, ErrOpen) {
		t.Errorf("tampered: err = %v, want ErrOpen", err)
	}
	if _, err := a.Open(id, sealed[:5], aad); !errors.Is(err, ErrOpen) {
		t.Errorf("truncated: err = %v, want ErrOpen", err)
	}
}

func TestErrorsHoldNoKeyMaterial(t *testing.T) {
	t.Parallel()
	k, _ := NewKeyring(testSalt, "super-secret-key-material")
	_, err := k.Open("nope", []byte("x"), nil)
	if err == nil || strings.Contains(err.Error(), "super-secret") {
		t.Errorf("err = %v", err)
	}
	if strings.Contains(k.CurrentID(), "super") {
		t.Error("key id reveals the key")
	}
}
