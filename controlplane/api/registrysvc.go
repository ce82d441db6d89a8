package api

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/go-containerregistry/pkg/name"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

// maxRegistryPassword bounds a registry password or token (registry
// tokens are JWTs of a few KiB at most).
const maxRegistryPassword = 16 << 10

// RegistryService implements levers9.v1.RegistryService.
type RegistryService struct {
	v1.UnimplementedRegistryServiceServer
	*Deps
}

var _ tasks.RegistryLogins = (*Deps)(nil)

// registryHost checks and normalizes a registry host[:port] the way image
// references name it ("docker.io" is "index.docker.io").
func registryHost(field, host string) (string, error) {
	if host == "" {
		return "", errInvalid(field, "is empty: name the registry as HOST or HOST:PORT")
	}
	if strings.Contains(host, "/") || strings.ContainsAny(host, " \t\r\n@") {
		return "", errInvalid(field, fmt.Sprintf("%q is not HOST or HOST:PORT (no scheme, path or user)", host))
	}
	r, err := name.NewRegistry(host, name.StrictValidation)
	if err != nil {
		return "", errInvalid(field, fmt.Sprintf("%q is not HOST or HOST:PORT: %v", host, err))
	}
	return r.RegistryStr(), nil
}

func registryCredentialPB(c store.RegistryCredential) *v1.RegistryCredential {
	return &v1.RegistryCredential{Host: c.Host, Username: c.Username, CreatedAt: ts(&c.CreatedAt), UpdatedAt: ts(&c.UpdatedAt)}
}

// LoginRegistry seals and stores the workspace's login to a registry,
// replacing an earlier one for the same host.
func (s *RegistryService) LoginRegistry(ctx context.Context, req *v1.LoginRegistryRequest) (*v1.LoginRegistryResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	host, err := registryHost("host", req.GetHost())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	user := req.GetUsername()
	if user == "" || len(user) > 256 || !utf8.ValidString(user) || strings.ContainsAny(user, ":\r\n") {
		return nil, errdefs.ToGRPC(errInvalid("username", "must be 1-256 characters without ':' or line breaks"))
	}
	pw := req.GetPassword()
	switch {
	case pw == "":
		return nil, errdefs.ToGRPC(errInvalid("password", "is empty: give the password or token on standard input"))
	case len(pw) > maxRegistryPassword:
		return nil, errdefs.ToGRPC(errInvalid("password", fmt.Sprintf("is %d bytes, more than the %d allowed", len(pw), maxRegistryPassword)))
	case strings.ContainsAny(pw, "\r\n"):
		return nil, errdefs.ToGRPC(errInvalid("password", "holds a line break"))
	}
	if s.Keyring == nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("the sealing keys are not ready yet: %w", errdefs.ErrUnavailable))
	}
	plain := []byte(pw)
	keyID, sealed, err := s.Keyring.Seal(plain, store.RegistryAAD(p.WorkspaceID, host))
	clear(plain)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	out, err := s.Store.PutRegistryCredential(ctx, store.RegistryCredential{ID: ids.New("reg"), WorkspaceID: p.WorkspaceID,
		Host: host, Username: user, Sealed: store.Sealed{KeyID: keyID, Bytes: sealed}})
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "registry.login", Object: host})
	return &v1.LoginRegistryResponse{Credential: registryCredentialPB(out)}, nil
}

// ListRegistryCredentials lists the workspace's logins: hosts and
// usernames, never passwords.
func (s *RegistryService) ListRegistryCredentials(ctx context.Context, _ *v1.ListRegistryCredentialsRequest) (*v1.ListRegistryCredentialsResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	list, err := s.Store.ListRegistryCredentials(ctx, p.WorkspaceID)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	resp := &v1.ListRegistryCredentialsResponse{}
	for _, c := range list {
		resp.Credentials = append(resp.Credentials, registryCredentialPB(c))
	}
	return resp, nil
}

// LogoutRegistry forgets the workspace's login to a registry.
func (s *RegistryService) LogoutRegistry(ctx context.Context, req *v1.LogoutRegistryRequest) (*v1.LogoutRegistryResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	host, err := registryHost("host", req.GetHost())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if err := s.Store.DeleteRegistryCredential(ctx, p.WorkspaceID, host); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "registry.logout", Object: host})
	return &v1.LogoutRegistryResponse{}, nil
}

// OpenRegistryLogin opens a workspace's login to host for a push (the
// controlplane's own use; never exposed through an RPC). ok=false when the
// workspace has none.
func (d *Deps) OpenRegistryLogin(ctx context.Context, wsID, host string) (string, string, bool, error) {
	c, err := d.Store.GetRegistryCredential(ctx, wsID, host)
	if errdefs.IsNotFound(err) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, err
	}
	if d.Keyring == nil {
		return "", "", false, fmt.Errorf("open the login to registry %s: the sealing keys are not ready yet: %w", host, errdefs.ErrUnavailable)
	}
	plain, err := d.Keyring.Open(c.Sealed.KeyID, c.Sealed.Bytes, store.RegistryAAD(wsID, host))
	if err != nil {
		return "", "", false, fmt.Errorf("open the login to registry %s: %w", host, err)
	}
	defer clear(plain)
	return c.Username, string(plain), true, nil
}
