package tasks

import (
	"context"
	"errors"
	"fmt"
	"strings"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// BuildKeyPrefix starts the idempotency key of every image build task
// (the image service's, see controlplane/images): dispatch finds the build
// by it. SubmitTask refuses it, so a user's task is never taken for a
// build.
const BuildKeyPrefix = "levers9-build."

// BuildRepositories are where builds push images and where copy steps'
// blobs are kept: repositories of worker.imageRegistry. Empty when it is
// not set (no builds then).
func BuildRepositories(c *config.Config) (images, blobs string) {
	reg := c.Worker.ImageRegistry
	if reg == "" {
		return "", ""
	}
	return reg + "/levers9/images", reg + "/levers9/blobs"
}

// SubmitBuild submits an image build task: Submit, allowing the reserved
// build key.
func (s *Submitter) SubmitBuild(ctx context.Context, workspaceID string, spec *v1.TaskSpec, key string) (*v1.Task, bool, error) {
	if !strings.HasPrefix(key, BuildKeyPrefix) {
		return nil, false, fmt.Errorf("submit build: key %q lacks the build prefix: %w", key, errdefs.ErrInvalidArgument)
	}
	return s.submit(ctx, workspaceID, spec, key)
}

// attachBuild turns the attempt of a build task into a build: the recipe,
// where it starts, and push credentials for this attempt only.
func (s *Scheduler) attachBuild(ctx context.Context, t store.Task, ta *agentv1.TaskAttempt) error {
	if !strings.HasPrefix(t.IdempotencyKey, BuildKeyPrefix) {
		return nil
	}
	img, err := s.d.store.ImageByBuildKey(ctx, t.WorkspaceID, t.IdempotencyKey)
	if errors.Is(err, errdefs.ErrNotFound) {
		// A later generation replaced it (forced rebuild): this attempt
		// builds nothing.
		return &unrunnable{summary: "this image build was replaced by a newer one"}
	}
	if err != nil {
		return err
	}
	repo, blobs := BuildRepositories(s.d.config)
	if repo == "" {
		return &unrunnable{summary: "worker.imageRegistry is not set: image builds push there"}
	}
	ta.Build = &agentv1.BuildSpec{Recipe: img.Recipe, BaseDigest: img.BaseDigest, Start: int32(img.StartStep), Parent: img.Parent,
		Repository: repo, BlobRepository: blobs, Hash: img.Hash}
	host, _, _ := strings.Cut(repo, "/")
	ta.Build.PushAuth, err = s.workspaceLogin(ctx, t.WorkspaceID, host)
	return err
}
