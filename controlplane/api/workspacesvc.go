package api

import (
	"context"
	"fmt"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// WorkspaceService implements levers9.v1.WorkspaceService.
type WorkspaceService struct {
	v1.UnimplementedWorkspaceServiceServer
	*Deps
}

func workspacePB(ws store.Workspace) *v1.Workspace {
	return &v1.Workspace{Id: ws.ID, Name: ws.Name, CreatedAt: ts(&ws.CreatedAt), HasStorageCredentials: ws.HasStorageCredentials}
}

// GetWorkspace describes the caller's workspace.
func (s *WorkspaceService) GetWorkspace(ctx context.Context, _ *v1.GetWorkspaceRequest) (*v1.GetWorkspaceResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	ws, err := s.Store.GetWorkspace(ctx, p.WorkspaceID)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.GetWorkspaceResponse{Workspace: workspacePB(ws)}, nil
}

// SetStorageCredentials seals and stores the workspace's storage
// credentials.
func (s *WorkspaceService) SetStorageCredentials(ctx context.Context, req *v1.SetStorageCredentialsRequest) (*v1.SetStorageCredentialsResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	c := req.GetCredentials()
	var missing []string
	for field, v := range map[string]string{"credentials.endpoint": c.GetEndpoint(), "credentials.bucket": c.GetBucket(),
		"credentials.access_key_id": c.GetAccessKeyId(), "credentials.secret_access_key": c.GetSecretAccessKey()} {
		if v == "" {
			missing = append(missing, field)
		}
	}
	if len(missing) > 0 {
		return nil, errdefs.ToGRPC(fmt.Errorf("%v required: %w", missing, errdefs.ErrInvalidArgument))
	}
	keyID, sealed, err := s.Keyring.Seal([]byte(c.GetSecretAccessKey()), store.StorageAAD(p.WorkspaceID))
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	pub := store.StoragePublic{Endpoint: c.GetEndpoint(), Bucket: c.GetBucket(), AccessKeyID: c.GetAccessKeyId(), Region: c.GetRegion()}
	if err := s.Store.SetStorageCredentials(ctx, p.WorkspaceID, pub, store.Sealed{KeyID: keyID, Bytes: sealed}); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.publish(ctx, bus.Event{Workspace: p.WorkspaceID, Kind: "workspace.storage.set", Object: p.WorkspaceID})
	ws, err := s.Store.GetWorkspace(ctx, p.WorkspaceID)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &v1.SetStorageCredentialsResponse{Workspace: workspacePB(ws)}, nil
}

// GetStorageCredentials returns the non-secret part of the credentials, and
// proves the sealed part still opens.
func (s *WorkspaceService) GetStorageCredentials(ctx context.Context, _ *v1.GetStorageCredentialsRequest) (*v1.GetStorageCredentialsResponse, error) {
	p, err := auth.MustPrincipal(ctx)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	pub, sealed, err := s.Store.GetStorageCredentials(ctx, p.WorkspaceID)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	plain, err := s.Keyring.Open(sealed.KeyID, sealed.Bytes, store.StorageAAD(p.WorkspaceID))
	if err != nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("storage credentials of %s: %w", p.WorkspaceID, err))
	}
	clear(plain)
	return &v1.GetStorageCredentialsResponse{Credentials: &v1.StorageCredentials{Endpoint: pub.Endpoint, Bucket: pub.Bucket,
		AccessKeyId: pub.AccessKeyID, Region: pub.Region}}, nil
}
