package enroll

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

func TestJoinTokenRoundTrip(t *testing.T) {
	t.Parallel()
	id, tok, hash := MintJoinToken()
	p, err := ParseJoinToken(tok)
	if err != nil || p.ID != id || !p.Matches(hash) {
		t.Fatalf("round trip: %v %v", p, err)
	}
	_, other, _ := MintJoinToken()
	po, _ := ParseJoinToken(other)
	if po.Matches(hash) {
		t.Fatal("another token matches")
	}
	masked := MaskJoinToken(tok)
	if strings.Contains(masked, tok[len(tok)-20:]) || !strings.HasPrefix(masked, "l9join_") {
		t.Errorf("mask %q shows the secret", masked)
	}
	for _, bad := range []string{"", "l9join", "levers9_" + tok[7:], tok + "x", strings.ToUpper(tok)} {
		if _, err := ParseJoinToken(bad); !errdefs.IsUnauthenticated(err) {
			t.Errorf("ParseJoinToken(%q) = %v", bad, err)
		}
	}
}

func TestSignAndVerify(t *testing.T) {
	t.Parallel()
	ca, certPEM, keyPEM, err := NewCA("test agents")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	keyP, csrP, err := NewKeyAndCSR("box-1")
	if err != nil {
		t.Fatal(err)
	}
	csr, err := ParseCSR(csrP)
	if err != nil {
		t.Fatal(err)
	}
	certP, exp, err := ca.Sign(csr, "m_abc", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if time.Until(exp) > time.Hour || time.Until(exp) < 59*time.Minute {
		t.Errorf("expiry %v", exp)
	}
	pair, err := tls.X509KeyPair(certP, keyP)
	if err != nil {
		t.Fatalf("certificate does not match the agent's key: %v", err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if id, err := MachineID(leaf); err != nil || id != "m_abc" {
		t.Errorf("MachineID = %q, %v", id, err)
	}
	// A certificate from another CA does not verify.
	other, _, _, _ := NewCA("other")
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: other.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("verified against a foreign CA")
	}
	if _, _, err := ca.Sign(csr, "bad/id", time.Hour); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad machine id: %v", err)
	}
}

func TestParseCSRRejects(t *testing.T) {
	t.Parallel()
	weak, _ := rsa.GenerateKey(rand.Reader, 1024)
	weakDER, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, weak)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	p224DER, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, p224)
	_, good, _ := NewKeyAndCSR("h")
	blk, _ := pem.Decode(good)
	tampered := append([]byte(nil), blk.Bytes...)
	tampered[len(tampered)-3] ^= 0xff
	for name, in := range map[string][]byte{
		"empty":     nil,
		"not pem":   []byte("hello"),
		"cert type": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: blk.Bytes}),
		"garbage":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte{1, 2, 3}}),
		"rsa 1024":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: weakDER}),
		"p224":      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: p224DER}),
		"tampered":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: tampered}),
		"oversized": append(good, make([]byte, maxPEM)...),
	} {
		if _, err := ParseCSR(in); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: err = %v, want invalid argument", name, err)
		}
	}
}

func TestWriteSecretFile(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "sub", "key.pem")
	if err := WriteSecretFile(p, []byte("k")); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	dst, _ := os.Stat(filepath.Dir(p))
	if st.Mode().Perm() != 0o600 || dst.Mode().Perm() != 0o700 {
		t.Errorf("modes %v %v", st.Mode().Perm(), dst.Mode().Perm())
	}
}

func FuzzParseJoinToken(f *testing.F) {
	_, tok, _ := MintJoinToken()
	f.Add(tok)
	f.Add("l9join__")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseJoinToken(s)
		if err == nil && (!strings.HasPrefix(p.ID, "jt_") || len(p.Hash()) != 32) {
			t.Fatalf("accepted %q as %v", s, p)
		}
		_ = MaskJoinToken(s)
	})
}

func FuzzParseCSR(f *testing.F) {
	_, good, _ := NewKeyAndCSR("h")
	f.Add(good)
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		csr, err := ParseCSR(b)
		if err == nil && csr.CheckSignature() != nil {
			t.Fatal("accepted a CSR with a bad signature")
		}
	})
}
