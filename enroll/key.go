package enroll

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"

	"github.com/levers9/levers9/internal/secretfile"
)

// NewKeyAndCSR makes the agent's key pair and a CSR for it. The key stays
// on the machine (write it with WriteSecretFile).
func NewKeyAndCSR(hostname string) (keyPEM, csrPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: hostname},
	}, key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// WriteSecretFile writes b to path with mode 0600 (its directory 0700),
// atomically, so a reader never sees a half-written key or token. It is
// secretfile.Write, named here for enroll's callers.
func WriteSecretFile(path string, b []byte) error {
	return secretfile.Write(path, b)
}
