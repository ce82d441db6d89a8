package seaweed

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A cluster's credentials. SeaweedFS checks three things, and levers9
// turns all three on:
//
//   - gRPC (master, volume server, filer; weed mount dials the filer's) is
//     mutual TLS: every server and client shows a certificate of the
//     cluster's CA, and each server admits only the common names that
//     need it (a mount's "client" certificate reaches the filer only).
//   - the volume server's HTTP port wants a JWT (jwt.signing) for each
//     write and delete, minted per file id by the master or the filer,
//     and one (jwt.signing.read) for each read, which the filer and weed
//     mount mint themselves.
//   - the filer's HTTP API wants a JWT (jwt.filer_signing, and
//     jwt.filer_signing.read for reads and listings), which only the
//     controlplane mints (Filer.Keys).
//
// The master's HTTP port hands out write tokens (/dir/assign) to whoever
// asks, so it answers only the cluster's own host (guard.white_list).
//
// Everything lives in one directory (0700), each file 0600, generated once
// by EnsureSecurity and read by LoadSecurity; servers get it through a
// security.toml (0600) in their working directory, never argv.

// Security file names in the security directory.
const (
	caCertFile = "ca.crt"
	caKeyFile  = "ca.key"
	// ClientName is the common name of the certificate mounts and the
	// controlplane use.
	ClientName = "client"

	volumeWriteKeyFile = "jwt-volume-write.key"
	volumeReadKeyFile  = "jwt-volume-read.key"
	filerWriteKeyFile  = "jwt-filer-write.key"
	filerReadKeyFile   = "jwt-filer-read.key"
)

// certNames are the identities with a certificate of their own.
var certNames = []string{"master", "volume", "filer", ClientName}

// Security is a cluster's credentials, as LoadSecurity read them.
type Security struct {
	// Dir holds the files.
	Dir string
	// VolumeWriteKey and VolumeReadKey sign the volume server's JWTs;
	// FilerWriteKey and FilerReadKey the filer's HTTP API's.
	VolumeWriteKey, VolumeReadKey string
	FilerWriteKey, FilerReadKey   string
}

// CertPath and KeyPath are the certificate and key of name (master,
// volume, filer or client).
func (s *Security) CertPath(name string) string { return filepath.Join(s.Dir, name+".crt") }

// KeyPath is name's private key.
func (s *Security) KeyPath(name string) string { return filepath.Join(s.Dir, name+".key") }

// CAPath is the CA certificate every side verifies the other with.
func (s *Security) CAPath() string { return filepath.Join(s.Dir, caCertFile) }

// FilerKeys are what the filer's HTTP API wants.
func (s *Security) FilerKeys() FilerKeys {
	return FilerKeys{Write: []byte(s.FilerWriteKey), Read: []byte(s.FilerReadKey)}
}

// EnsureSecurity returns the credentials in dir, generating them first
// when dir has none (a CA, a certificate per server and one for clients,
// four JWT keys). Files already there are kept, so a cluster keeps its
// credentials across restarts.
func EnsureSecurity(dir string) (*Security, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("SeaweedFS credentials: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("SeaweedFS credentials: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, caCertFile)); errors.Is(err, fs.ErrNotExist) {
		if err := generateSecurity(dir); err != nil {
			return nil, fmt.Errorf("generating SeaweedFS credentials in %s: %w", dir, err)
		}
	}
	return LoadSecurity(dir)
}

// SecurityFiles are the files LoadSecurity needs in a security
// directory: everything EnsureSecurity writes but the CA's key (ca.key),
// which only signs certificates and which no server, mount or controlplane
// reads, so it need not leave the directory it was made in.
func SecurityFiles() []string {
	out := []string{caCertFile}
	for _, n := range certNames {
		out = append(out, n+".crt", n+".key")
	}
	return append(out, volumeWriteKeyFile, volumeReadKeyFile, filerWriteKeyFile, filerReadKeyFile)
}

// CopySecurity copies SecurityFiles from one directory into another as
// the caller's own files, each 0600 in a 0700 directory (made if need be),
// and loads the copy. It is for credentials delivered with modes
// LoadSecurity refuses: a Kubernetes Secret mounted in a pod whose
// securityContext has an fsGroup is made 0440 and group-owned by it
// whatever the volume's defaultMode, so the chart's init container copies
// it into a memory-backed emptyDir with this (levers9-controlplane
// seaweedfs-credentials). Other files in from are left behind. Errors name
// files, never what they hold.
func CopySecurity(from, to string) (*Security, error) {
	if err := os.MkdirAll(to, 0o700); err != nil {
		return nil, fmt.Errorf("copying SeaweedFS credentials: %w", err)
	}
	if err := os.Chmod(to, 0o700); err != nil {
		return nil, fmt.Errorf("copying SeaweedFS credentials: %w", err)
	}
	var errs []error
	for _, f := range SecurityFiles() {
		// ReadFile follows a Secret volume's ..data symlinks.
		b, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := writeSecret(filepath.Join(to, f), b); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("copying SeaweedFS credentials from %s to %s: %w", from, to, err)
	}
	return LoadSecurity(to)
}

// LoadSecurity reads the credentials in dir, naming every file that is
// missing, unreadable or readable by others. Errors never hold a key.
func LoadSecurity(dir string) (*Security, error) {
	s := &Security{Dir: dir}
	var errs []error
	need := []string{caCertFile}
	for _, n := range certNames {
		need = append(need, n+".crt", n+".key")
	}
	for _, f := range need {
		p := filepath.Join(dir, f)
		st, err := os.Stat(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		if strings.HasSuffix(f, ".key") && st.Mode().Perm()&0o077 != 0 {
			errs = append(errs, fmt.Errorf("%s: mode %v, want 0600 (a private key)", p, st.Mode().Perm()))
		}
	}
	for f, dst := range map[string]*string{
		volumeWriteKeyFile: &s.VolumeWriteKey, volumeReadKeyFile: &s.VolumeReadKey,
		filerWriteKeyFile: &s.FilerWriteKey, filerReadKeyFile: &s.FilerReadKey,
	} {
		p := filepath.Join(dir, f)
		st, err := os.Stat(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		if st.Mode().Perm()&0o077 != 0 {
			errs = append(errs, fmt.Errorf("%s: mode %v, want 0600 (a signing key)", p, st.Mode().Perm()))
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		k := strings.TrimSpace(string(b))
		if len(k) < 32 || strings.ContainsAny(k, "\"\\\n") {
			errs = append(errs, fmt.Errorf("%s: want at least 32 characters without quotes or backslashes", p))
			continue
		}
		*dst = k
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("SeaweedFS credentials in %s: %w", dir, err)
	}
	return s, nil
}

func generateSecurity(dir string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour)
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "levers9 SeaweedFS CA"},
		NotBefore: now, NotAfter: now.AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, caKeyFile), "EC PRIVATE KEY", mustMarshalEC(caKey)); err != nil {
		return err
	}
	for _, name := range certNames {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
			NotBefore: now, NotAfter: now.AddDate(10, 0, 0),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:    []string{name},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, name+".key"), "EC PRIVATE KEY", mustMarshalEC(key)); err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der); err != nil {
			return err
		}
	}
	for _, f := range []string{volumeWriteKeyFile, volumeReadKeyFile, filerWriteKeyFile, filerReadKeyFile} {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		if err := writeSecret(filepath.Join(dir, f), []byte(hex.EncodeToString(b)+"\n")); err != nil {
			return err
		}
	}
	// The CA certificate last: its presence says the rest is there.
	return writePEM(filepath.Join(dir, caCertFile), "CERTIFICATE", caDER)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func mustMarshalEC(k *ecdsa.PrivateKey) []byte {
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		panic(err) // a P-256 key always marshals
	}
	return b
}

func writePEM(path, typ string, der []byte) error {
	return writeSecret(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

// writeSecret writes b to path with mode 0600, also when a file was there.
func writeSecret(path string, b []byte) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	return os.Chmod(path, 0o600)
}

// ServerConfig is the security.toml of a server (master, volume or filer):
// its gRPC certificate and the common names it admits, the JWT keys it
// signs or checks with; the master admits HTTP calls from whitelist only.
func (s *Security) ServerConfig(name string, whitelist []string) string {
	admit := "master,volume,filer"
	if name == "filer" {
		admit += "," + ClientName
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# written by levers9 (internal/seaweed): the %s's credentials; keep 0600\n", name)
	fmt.Fprintf(&b, "[jwt.signing]\nkey = %q\nexpires_after_seconds = 10\n\n", s.VolumeWriteKey)
	fmt.Fprintf(&b, "[jwt.signing.read]\nkey = %q\nexpires_after_seconds = 60\n\n", s.VolumeReadKey)
	if name == "filer" {
		fmt.Fprintf(&b, "[jwt.filer_signing]\nkey = %q\nexpires_after_seconds = 10\n\n", s.FilerWriteKey)
		fmt.Fprintf(&b, "[jwt.filer_signing.read]\nkey = %q\nexpires_after_seconds = 60\n\n", s.FilerReadKey)
	}
	if name == "master" && len(whitelist) > 0 {
		fmt.Fprintf(&b, "[guard]\nwhite_list = %q\n\n", strings.Join(whitelist, ","))
	}
	b.WriteString("[access]\nui = false\n\n")
	fmt.Fprintf(&b, "[grpc]\nca = %q\n\n", s.CAPath())
	fmt.Fprintf(&b, "[grpc.%s]\ncert = %q\nkey = %q\nallowed_commonNames = %q\n", name, s.CertPath(name), s.KeyPath(name), admit)
	return b.String()
}
