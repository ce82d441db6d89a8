// Package tunneltest holds helpers for testing and benchmarking the tunnel
// package: an in-memory certificate authority and a tiny echo gRPC service
// built on well-known protobuf types. It must never be imported by
// production code. Its API changes with the tests that use it.
package tunneltest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is an in-memory certificate authority.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	Pool *x509.CertPool
}

// NewCA makes a fresh CA valid for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, key: key, Pool: pool}, nil
}

// Issue signs a leaf for cn valid between notBefore and notAfter; server
// leaves get 127.0.0.1, ::1 and "localhost" as names.
func (ca *CA) Issue(cn string, server bool, notBefore, notAfter time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 199, 0, 1), net.IPv4(10, 199, 0, 2)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("issuing %s: %w", cn, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// ServerTLS is a server config with a fresh leaf, verifying clients against ca.
func (ca *CA) ServerTLS() (*tls.Config, error) {
	c, err := ca.Issue("controlplane", true, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{c}, ClientCAs: ca.Pool}, nil
}

// ClientTLS is an agent config with a fresh leaf for cn.
func (ca *CA) ClientTLS(cn string) (*tls.Config, error) {
	c, err := ca.Issue(cn, false, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{c}, RootCAs: ca.Pool}, nil
}

// WritePEM stores the CA certificate and key in dir (key mode 0600) so a
// re-executed process can LoadCA it.
func (ca *CA) WritePEM(dir string) error {
	kb, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "ca-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
}

// LoadCA reads a CA written by WritePEM.
func LoadCA(dir string) (*CA, error) {
	cb, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return nil, err
	}
	kb, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		return nil, err
	}
	c, _ := pem.Decode(cb)
	k, _ := pem.Decode(kb)
	if c == nil || k == nil {
		return nil, fmt.Errorf("CA in %s: not PEM", dir)
	}
	cert, err := x509.ParseCertificate(c.Bytes)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParseECPrivateKey(k.Bytes)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, key: key, Pool: pool}, nil
}
