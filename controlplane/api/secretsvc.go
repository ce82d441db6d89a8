package api

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

// maxSecretBytes bounds one secret's values.
const maxSecretBytes = 64 << 10

func errInvalid(field, msg string) error {
	return fmt.Errorf("%s %s: %w", field, msg, errdefs.ErrInvalidArgument)
}

// SecretService implements levers9.v1.SecretService.
type SecretService struct {
	v1.UnimplementedSecretServiceServer
	*Deps
}

func secretPB(s store.Secret) *v1.Secret {
	return &v1.Secret{Id: s.ID, Name: s.Name, WorkspaceId: s.WorkspaceID, Keys: s.Keys,
		CreatedAt: ts(&s.CreatedAt), UpdatedAt: ts(&s.UpdatedAt)}
}

// PutSecret seals and stores a secret.
func (s *SecretService) PutSecret(ctx context.Context, req *v1.PutSecretRequest) (*v1.PutSecretResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if err := checkName("name", req.GetName()); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if len(req.GetValues()) == 0 {
		return nil, errdefs.ToGRPC(errInvalid("values", "must hold at least one KEY=VALUE"))
	}
	keys := make([]string, 0, len(req.GetValues()))
	for k := range req.GetValues() {
		if err := checkName("values key", k); err != nil {
			return nil, errdefs.ToGRPC(err)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	plain, err := json.Marshal(req.GetValues())
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if len(plain) > maxSecretBytes {
		return nil, errdefs.ToGRPC(errInvalid("values", fmt.Sprintf("are %d bytes, more than the %d allowed", len(plain), maxSecretBytes)))
	}
	keyID, sealed, err := s.Keyring.Seal(plain, store.SecretAAD(p.WorkspaceID, req.GetName()))
	clear(plain)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	out, err := s.Store.PutSecret(ctx, store.Secret{ID: ids.New("sec"), WorkspaceID: p.WorkspaceID, Name: req.GetName(),
		Keys: keys, Sealed: store.Sealed{KeyID: keyID, Bytes: sealed}})
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "secret.put", Object: out.Name})
	return &v1.PutSecretResponse{Secret: secretPB(out)}, nil
}

// ListSecrets lists secret names and keys, never values.
func (s *SecretService) ListSecrets(ctx context.Context, _ *v1.ListSecretsRequest) (*v1.ListSecretsResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	list, err := s.Store.ListSecrets(ctx, p.WorkspaceID)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	resp := &v1.ListSecretsResponse{}
	for _, sec := range list {
		resp.Secrets = append(resp.Secrets, secretPB(sec))
	}
	return resp, nil
}

// DeleteSecret deletes a secret of the caller's workspace.
func (s *SecretService) DeleteSecret(ctx context.Context, req *v1.DeleteSecretRequest) (*v1.DeleteSecretResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if err := s.Store.DeleteSecret(ctx, p.WorkspaceID, req.GetName()); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "secret.deleted", Object: req.GetName()})
	return &v1.DeleteSecretResponse{}, nil
}

// OpenSecret returns a secret's values for the controlplane's own use
// (handing them to a task). Never exposed through the API.
func (d *Deps) OpenSecret(ctx context.Context, wsID, name string) (map[string]string, error) {
	sec, err := d.Store.GetSecret(ctx, wsID, name)
	if err != nil {
		return nil, err
	}
	plain, err := d.Keyring.Open(sec.Sealed.KeyID, sec.Sealed.Bytes, store.SecretAAD(wsID, name))
	if err != nil {
		return nil, fmt.Errorf("open secret %s: %w", name, err)
	}
	defer clear(plain)
	var vals map[string]string
	if err := json.Unmarshal(plain, &vals); err != nil {
		// Not err: a syntax error quotes the text, here the value.
		return nil, fmt.Errorf("decode secret %s: its opened value is not a JSON object of strings", name)
	}
	return vals, nil
}
