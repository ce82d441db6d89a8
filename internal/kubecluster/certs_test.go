package kubecluster

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func TestPKI(t *testing.T) {
	dir := t.TempDir()
	p, err := newPKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := p.clientKubeconfig("admin", "levers9-admin", []string{"system:masters"}, "https://127.0.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(readCert(t, p.path("ca.crt")))

	serving := readCert(t, p.path("apiserver.crt"))
	for _, name := range []string{"127.0.0.1", "localhost", "kubernetes.default", serviceIP} {
		if _, err := serving.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
	admin := readCert(t, p.path("admin.crt"))
	if _, err := admin.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("admin client certificate: %v", err)
	}
	if admin.Subject.CommonName != "levers9-admin" || len(admin.Subject.Organization) != 1 || admin.Subject.Organization[0] != "system:masters" {
		t.Errorf("admin subject = %v, want CN levers9-admin in O system:masters", admin.Subject)
	}

	// Every private key and kubeconfig is 0600; certificates may be read.
	want := map[string]os.FileMode{
		"ca.key": 0o600, "apiserver.key": 0o600, "sa.key": 0o600, "admin.key": 0o600, "admin.kubeconfig": 0o600,
		"ca.crt": 0o644, "sa.pub": 0o644,
	}
	for name, mode := range want {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s mode = %v, want %v", name, st.Mode().Perm(), mode)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatalf("loading the kubeconfig: %v", err)
	}
	if cfg.Host != "https://127.0.0.1:6443" || cfg.CertFile != p.path("admin.crt") {
		t.Errorf("kubeconfig host %q cert %q", cfg.Host, cfg.CertFile)
	}
}

func TestFindBuildScript(t *testing.T) {
	wd, _ := os.Getwd()
	got, err := FindBuildScript(wd)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(filepath.Dir(filepath.Dir(wd)), BuildScriptPath); got != want {
		t.Errorf("FindBuildScript = %s, want %s", got, want)
	}
	if _, err := FindBuildScript(t.TempDir()); err == nil {
		t.Error("found a build script outside the repository")
	}
}

func TestCheckBinDir(t *testing.T) {
	dir := t.TempDir()
	if err := checkBinDir(dir); err == nil {
		t.Fatal("an empty directory passed")
	}
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkBinDir(dir); err != nil {
		t.Errorf("a complete directory: %v", err)
	}
}
