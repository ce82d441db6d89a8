package enroll

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// machineURIPrefix is how a certificate names its machine: a URI SAN
// levers9://machine/<id>.
const machineURIPrefix = "levers9://machine/"

// maxPEM bounds PEM input so a hostile caller cannot make us parse megabytes.
const maxPEM = 16 << 10

// CA signs agent client certificates. It is immutable and safe for
// concurrent use.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

// NewCA makes a fresh CA (ECDSA P-256, valid ten years) and returns it with
// its certificate and PKCS#8 key in PEM.
func NewCA(name string) (ca *CA, certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"levers9"}},
		NotBefore:             time.Now().Add(-5 * time.Minute),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb})
	ca, err = LoadCA(certPEM, keyPEM)
	return ca, certPEM, keyPEM, err
}

// LoadCA reads a CA from PEM.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("CA certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("CA key is not PEM")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, errors.New("CA key does not parse as PKCS#8")
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("CA key cannot sign")
	}
	return &CA{cert: cert, key: signer, pem: certPEM}, nil
}

// CertPEM is the CA certificate.
func (c *CA) CertPEM() []byte { return c.pem }

// Pool is a cert pool holding just this CA, for verifying agents.
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.cert)
	return p
}

// ParseCSR reads and checks a PEM certificate request: size, signature and
// key strength. The requested subject is ignored by Sign.
func ParseCSR(csrPEM []byte) (*x509.CertificateRequest, error) {
	if len(csrPEM) > maxPEM {
		return nil, fmt.Errorf("CSR is %d bytes, more than %d: %w", len(csrPEM), maxPEM, errdefs.ErrInvalidArgument)
	}
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("CSR is not a PEM CERTIFICATE REQUEST: %w", errdefs.ErrInvalidArgument)
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CSR does not parse: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("CSR signature is wrong: %w", errdefs.ErrInvalidArgument)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("CSR key curve %s is not P-256 or P-384: %w", k.Curve.Params().Name, errdefs.ErrInvalidArgument)
		}
	case ed25519.PublicKey:
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("CSR RSA key has %d bits, fewer than 2048: %w", k.N.BitLen(), errdefs.ErrInvalidArgument)
		}
	default:
		return nil, fmt.Errorf("CSR key type %T is not supported: %w", k, errdefs.ErrInvalidArgument)
	}
	return csr, nil
}

// Sign issues a client certificate for machineID with the CSR's public key,
// valid for ttl. It returns the certificate in PEM and its expiry.
func (c *CA) Sign(csr *x509.CertificateRequest, machineID string, ttl time.Duration) ([]byte, time.Time, error) {
	u, err := url.Parse(machineURIPrefix + machineID)
	if err != nil || machineID == "" || strings.ContainsAny(machineID, "/?#") {
		return nil, time.Time{}, fmt.Errorf("machine id %q is not usable in a certificate: %w", machineID, errdefs.ErrInvalidArgument)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, time.Time{}, err
	}
	now := time.Now()
	notAfter := now.Add(ttl)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: machineID, Organization: []string{"levers9 agents"}},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, csr.PublicKey, c.key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("sign certificate for %s: %w", machineID, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), notAfter, nil
}

// MachineID reads the machine ID a certificate was issued to.
func MachineID(cert *x509.Certificate) (string, error) {
	for _, u := range cert.URIs {
		if id, ok := strings.CutPrefix(u.String(), machineURIPrefix); ok && id != "" {
			return id, nil
		}
	}
	return "", fmt.Errorf("certificate names no levers9 machine: %w", errdefs.ErrUnauthenticated)
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// SerialOf returns a PEM certificate's serial number in hex.
func SerialOf(certPEM []byte) (string, error) {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return "", errors.New("certificate is not PEM")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return "", err
	}
	return c.SerialNumber.Text(16), nil
}

// ServerCertificate issues a TLS server certificate for the controlplane's
// tunnel endpoint, signed by the agent CA, so agents need to trust only the
// CA they received at enrollment.
func (c *CA) ServerCertificate(hosts []string, ttl time.Duration) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := randomSerial()
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "levers9 controlplane tunnel"},
		NotBefore:    time.Now().Add(-5 * time.Minute),
		NotAfter:     time.Now().Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("sign the tunnel certificate: %w", err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}
