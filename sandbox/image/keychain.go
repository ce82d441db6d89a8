package image

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/google/go-containerregistry/pkg/authn"
)

// Credentials authenticate to one registry. Either Username and Password,
// or an IdentityToken (OAuth refresh token), or a RegistryToken (bearer).
// Its String and LogValue never reveal a secret, so a Credentials value that
// reaches a log or an error message prints as redacted.
type Credentials struct {
	Username      string
	Password      string
	IdentityToken string
	RegistryToken string
}

// String implements fmt.Stringer without revealing secrets.
func (c Credentials) String() string {
	return fmt.Sprintf("Credentials{Username:%q, secrets:REDACTED}", c.Username)
}

// GoString keeps %#v from printing the secrets.
func (c Credentials) GoString() string { return c.String() }

// LogValue implements slog.LogValuer without revealing secrets.
func (c Credentials) LogValue() slog.Value {
	return slog.GroupValue(slog.String("username", c.Username), slog.String("secrets", "REDACTED"))
}

// Keychain supplies registry credentials: the store's own (Config.Keychain)
// or one pull's (PullWith). The agent hands each pull the login of the
// task's workspace that the controlplane attached to that push.
//
// Contract: Credentials may block (it may ask the controlplane) and must
// honour ctx; it is called concurrently; ok=false means anonymous access. It
// is called at most once per registry per pull.
type Keychain interface {
	Credentials(ctx context.Context, registry string) (c Credentials, ok bool, err error)
}

// StaticKeychain maps a registry host (e.g. "127.0.0.1:5000") to credentials.
// A nil one has none, so it may be passed where a Keychain is optional.
type StaticKeychain map[string]Credentials

// Credentials implements Keychain.
func (k StaticKeychain) Credentials(_ context.Context, registry string) (Credentials, bool, error) {
	c, ok := k[registry]
	return c, ok, nil
}

// authenticator is the login to registry: the pull's own keychain (kc)
// first, then the store's Config.Keychain, else anonymous.
func (s *Store) authenticator(ctx context.Context, registry string, kc Keychain) (authn.Authenticator, error) {
	var c Credentials
	var ok bool
	for _, k := range []Keychain{kc, s.cfg.Keychain} {
		if k == nil {
			continue
		}
		var err error
		c, ok, err = k.Credentials(ctx, registry)
		if err != nil {
			// The keychain's error is the caller's; it must not contain secrets.
			return nil, fmt.Errorf("credentials for registry %s: %w", registry, err)
		}
		if ok {
			break
		}
	}
	if !ok {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(authn.AuthConfig{
		Username:      c.Username,
		Password:      c.Password,
		IdentityToken: c.IdentityToken,
		RegistryToken: c.RegistryToken,
	}), nil
}
