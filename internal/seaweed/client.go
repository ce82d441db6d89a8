package seaweed

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// MountCredentials are what `weed mount` needs to reach a secured cluster:
// the CA, the client certificate and key (PEM) for the filer's gRPC, and
// the key it signs volume server reads with. They travel as KEY=VALUE
// entries (Env, SplitMountEnv) and reach weed as 0600 files
// (WriteMountConfig), never in argv or its environment.
type MountCredentials struct {
	CAPEM, CertPEM, KeyPEM []byte
	VolumeReadKey          string
}

// The KEY=VALUE names MountCredentials travel under. They are levers9's,
// not weed's: weed never sees them.
const (
	EnvMountCA      = "LEVERS9_WEED_CA_PEM"
	EnvMountCert    = "LEVERS9_WEED_CLIENT_CERT_PEM"
	EnvMountKey     = "LEVERS9_WEED_CLIENT_KEY_PEM"
	EnvMountReadKey = "LEVERS9_WEED_JWT_SIGNING_READ_KEY"
)

// MountCredentials reads the client certificate's files.
func (s *Security) MountCredentials() (MountCredentials, error) {
	var c MountCredentials
	var err error
	if c.CAPEM, err = os.ReadFile(s.CAPath()); err != nil {
		return c, fmt.Errorf("SeaweedFS mount credentials: %w", err)
	}
	if c.CertPEM, err = os.ReadFile(s.CertPath(ClientName)); err != nil {
		return c, fmt.Errorf("SeaweedFS mount credentials: %w", err)
	}
	if c.KeyPEM, err = os.ReadFile(s.KeyPath(ClientName)); err != nil {
		return c, fmt.Errorf("SeaweedFS mount credentials: %w", err)
	}
	c.VolumeReadKey = s.VolumeReadKey
	return c, nil
}

// Empty reports whether c holds nothing (an unsecured cluster).
func (c MountCredentials) Empty() bool {
	return len(c.CAPEM) == 0 && len(c.CertPEM) == 0 && len(c.KeyPEM) == 0 && c.VolumeReadKey == ""
}

// Env is c as KEY=VALUE entries.
func (c MountCredentials) Env() []string {
	return []string{
		EnvMountCA + "=" + string(c.CAPEM), EnvMountCert + "=" + string(c.CertPEM),
		EnvMountKey + "=" + string(c.KeyPEM), EnvMountReadKey + "=" + c.VolumeReadKey,
	}
}

// SplitMountEnv takes the MountCredentials out of env and returns them
// and the entries left.
func SplitMountEnv(env []string) (MountCredentials, []string) {
	var c MountCredentials
	var rest []string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case EnvMountCA:
			c.CAPEM = []byte(v)
		case EnvMountCert:
			c.CertPEM = []byte(v)
		case EnvMountKey:
			c.KeyPEM = []byte(v)
		case EnvMountReadKey:
			c.VolumeReadKey = v
		default:
			rest = append(rest, kv)
		}
	}
	return c, rest
}

// MountConfigFiles are the files WriteMountConfig writes.
var MountConfigFiles = []string{"ca.crt", "client.crt", "client.key", "security.toml"}

// WriteMountConfig writes c into dir, weed mount's working directory: the
// PEM files and a security.toml pointing at them, each 0600 (weed reads
// ./security.toml first). Errors name files, never their content.
func (c MountCredentials) WriteMountConfig(dir string) error {
	var missing []string
	for name, v := range map[string]int{"CA": len(c.CAPEM), "client certificate": len(c.CertPEM), "client key": len(c.KeyPEM), "read key": len(c.VolumeReadKey)} {
		if v == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("SeaweedFS mount credentials: incomplete (no %s)", strings.Join(missing, ", "))
	}
	if strings.ContainsAny(c.VolumeReadKey, "\"\\\n") {
		return errors.New("SeaweedFS mount credentials: the read key holds quotes, backslashes or newlines")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("SeaweedFS mount credentials: %w", err)
	}
	ca, cert, key := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	toml := fmt.Sprintf(`# written by levers9 (volumes/seaweedfs): this mount's credentials; keep 0600
[jwt.signing.read]
key = %q
expires_after_seconds = 60

[grpc]
ca = %q

[grpc.client]
cert = %q
key = %q
`, c.VolumeReadKey, ca, cert, key)
	for p, b := range map[string][]byte{ca: c.CAPEM, cert: c.CertPEM, key: c.KeyPEM, filepath.Join(dir, "security.toml"): []byte(toml)} {
		if err := writeSecret(p, b); err != nil {
			return fmt.Errorf("SeaweedFS mount credentials: writing %s: %w", p, err)
		}
	}
	return nil
}

// FilerKeys sign requests to the filer's HTTP API: Write for POST, PUT
// and DELETE, Read for GET and HEAD. An empty key sends no token.
type FilerKeys struct {
	Write, Read []byte
}

// filerToken is an HS256 JWT the filer accepts (weed's
// SeaweedFilerClaims with only an expiry: every path, every method),
// valid for ttl.
func filerToken(key []byte, ttl time.Duration) string {
	enc := base64.RawURLEncoding
	header := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	claims, _ := json.Marshal(map[string]int64{"exp": time.Now().Add(ttl).Unix()})
	signing := header + "." + enc.EncodeToString(claims)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signing))
	return signing + "." + enc.EncodeToString(mac.Sum(nil))
}
