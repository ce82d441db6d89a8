package tasks

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/controlplane/store"
)

// RegistryLogins opens a workspace's stored login to one image registry
// host for a push. ok=false means the workspace has none (the pull goes
// anonymous). Safe for concurrent use; errors never hold the password.
type RegistryLogins interface {
	OpenRegistryLogin(ctx context.Context, wsID, host string) (username, password string, ok bool, err error)
}

// ImageRegistryHost is the registry host[:port] an image reference pulls
// from, resolving a reference without one against defaultRegistry
// (worker.imageRegistry) as the agent's image cache does.
func ImageRegistryHost(ref, defaultRegistry string) (string, error) {
	var opts []name.Option
	if defaultRegistry != "" {
		opts = append(opts, name.WithDefaultRegistry(defaultRegistry))
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", ref, err)
	}
	return r.Context().RegistryStr(), nil
}

// attachRegistryAuth adds the task's workspace's login to the image's
// registry to this push only; nothing is stored with the attempt.
func (s *Scheduler) attachRegistryAuth(ctx context.Context, t store.Task, ta *agentv1.TaskAttempt) error {
	host, err := ImageRegistryHost(ta.GetImage(), s.d.config.Worker.ImageRegistry)
	if err != nil {
		// The agent refuses the reference with its own words.
		return nil
	}
	auth, err := s.workspaceLogin(ctx, t.WorkspaceID, host)
	if err != nil {
		return err
	}
	ta.RegistryAuth = auth
	return nil
}

// workspaceLogin opens a workspace's login to a registry host for one push;
// nil when it has none (or the scheduler has no logins).
func (s *Scheduler) workspaceLogin(ctx context.Context, wsID, host string) (*agentv1.RegistryAuth, error) {
	if s.d.logins == nil {
		return nil, nil
	}
	user, password, ok, err := s.d.logins.OpenRegistryLogin(ctx, wsID, host)
	if err != nil {
		return nil, fmt.Errorf("open the workspace's login to registry %s: %w", host, err)
	}
	if !ok {
		return nil, nil
	}
	return &agentv1.RegistryAuth{Host: host, Username: user, Password: password}, nil
}
