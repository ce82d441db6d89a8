package controlplanetest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/devstack"
)

// SelfSignedTLS writes a self-signed certificate for 127.0.0.1, localhost
// and extraIPs into a temp dir and returns the cert and key paths. The
// certificate is its own CA, so the cert path is also the CA file.
func SelfSignedTLS(t testing.TB, extraIPs ...string) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM, err := devstack.SelfSignedCert("levers9-test", 24*time.Hour, extraIPs...)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}
