package agents

import (
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/crypto/chacha20poly1305"
)

// Sealing: a forwarded call carries an agent request and its reply an agent
// response, which may hold secrets (TaskAttempt.registry_auth, secret_env).
// Their body (the marshalled payload and the reply's status message) never
// travels in clear: it is sealed with XChaCha20-Poly1305 under a key that
// is HKDF-SHA256 of the replica secret with sealLabel (distinct from the MAC
// key's label), with a fresh random 24-byte nonce per message, and the
// message's header (format version, addressee, kind, ID, sender, machine,
// method, timeout, code) as associated data. The wire field is
// "sealed" = nonce || ciphertext.
//
// The MAC (replicaauth.go) stays and covers the ciphertext
// (encrypt-then-MAC): it is what every replica message, sealed or not
// (pings, drops, presence records), is checked by for age and replay, so
// sealing adds confidentiality without a second replay scheme. The
// associated data makes a ciphertext useless anywhere but in the message it
// was sealed for, even to someone able to sign: moved to another machine,
// method, call ID or replica, it does not open.
//
// Format versions: forwardVersion is 2 (v1, before sealing, sent the body
// in clear as "payload" and "message" and had no "v"). A replica refuses a
// message of another version, counted as old_version (an authentic v1
// message: its MAC checks under the v1 field list) or unknown_version
// (newer), and says which side to upgrade. During a rolling upgrade,
// forwarded pushes between old and new replicas therefore fail (the push
// is Unavailable; the scheduler handles it as any unreachable machine);
// pushes on the replica holding the tunnel are unaffected.

const (
	sealLabel = "levers9 replica payloads v1"
	// forwardVersion is the format of forwarded messages this replica sends
	// and accepts.
	forwardVersion = 2
)

// errSeal is why a sealed body did not open; it never holds body bytes.
var errSeal = errors.New("the sealed body did not open")

// sealKey derives the body-sealing key of one replica secret.
func sealKey(secret string) ([]byte, error) {
	return hkdf.Key(sha256.New, []byte(secret), nil, sealLabel, chacha20poly1305.KeySize)
}

// newSealers makes one AEAD per replica secret; the first seals, every one
// opens (rotation).
func newSealers(secrets []string) ([]cipher.AEAD, error) {
	var out []cipher.AEAD
	for _, s := range secrets {
		k, err := sealKey(s)
		if err != nil {
			return nil, fmt.Errorf("derive the replica sealing key: %w", err)
		}
		a, err := chacha20poly1305.NewX(k)
		if err != nil {
			return nil, fmt.Errorf("replica sealing key: %w", err)
		}
		out = append(out, a)
	}
	return out, nil
}

// lengthPrefixed joins fields so that no two lists encode alike.
func lengthPrefixed(fields ...string) []byte {
	var b []byte
	for _, f := range fields {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return b
}

// sealBody encrypts body under the current key with a fresh nonce, bound to
// ad.
func (a *replicaAuth) sealBody(ad, body []byte) []byte {
	aead := a.sealers[0]
	out := make([]byte, aead.NonceSize(), aead.NonceSize()+len(body)+aead.Overhead())
	_, _ = rand.Read(out)
	return aead.Seal(out, out, body, ad)
}

// openBody decrypts what sealBody made with any known key, checking ad.
func (a *replicaAuth) openBody(ad, sealed []byte) ([]byte, error) {
	for _, aead := range a.sealers {
		if len(sealed) < aead.NonceSize()+aead.Overhead() {
			return nil, errSeal
		}
		if body, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], ad); err == nil {
			return body, nil
		}
	}
	return nil, errSeal
}

// body is what a forwarded message seals: its payload and status message.
func (m *forwardMsg) body() []byte {
	b := binary.AppendUvarint(nil, uint64(len(m.Payload)))
	b = append(b, m.Payload...)
	return append(b, m.Message...)
}

// setBody fills Payload and Message from an opened body.
func (m *forwardMsg) setBody(b []byte) error {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return errSeal
	}
	m.Payload, m.Message = b[k:k+int(n)], string(b[k+int(n):])
	return nil
}
