package images

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image/recipe"
)

// Deps are what the service uses.
type Deps struct {
	Store  *store.Store
	Tasks  *tasks.Submitter
	Config *config.Config
	// Logins opens a workspace's registry login (nil: anonymous).
	Logins tasks.RegistryLogins
	Log    *slog.Logger
	Now    func() time.Time
	// BlobLimit caps one blob (DefaultBlobLimit when 0).
	BlobLimit int64
}

// DefaultBlobLimit caps one copy step's source.
const DefaultBlobLimit = 512 << 20

// buildTimeout bounds one build task.
const buildTimeout = 30 * time.Minute

// Service builds images. Safe for concurrent use.
type Service struct{ d Deps }

// New returns the service.
func New(d Deps) *Service {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.BlobLimit <= 0 {
		d.BlobLimit = DefaultBlobLimit
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	return &Service{d: d}
}

// Result is what Build did.
type Result struct {
	Image  *v1.Image
	Cached bool
	Joined bool
}

// Build starts (or joins, or skips) the build of a recipe for a workspace.
func (s *Service) Build(ctx context.Context, wsID string, data []byte, force bool) (Result, error) {
	r, err := recipe.Parse(data)
	if err != nil {
		return Result{}, fmt.Errorf("recipe: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	if err := r.Validate(); err != nil {
		return Result{}, fmt.Errorf("recipe: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	repo, _ := tasks.BuildRepositories(s.d.Config)
	if repo == "" {
		return Result{}, fmt.Errorf("build image: worker.imageRegistry is not set: builds push there: %w", errdefs.ErrFailedPrecondition)
	}
	for i, st := range r.Steps {
		if st.Copy == nil {
			continue
		}
		if st.Copy.Blob == "" {
			return Result{}, fmt.Errorf("recipe: steps[%d]: copy %s has no blob: upload its source first (levers9 image build does): %w",
				i, st.Copy.Src, errdefs.ErrInvalidArgument)
		}
		if _, err := s.d.Store.ImageBlob(ctx, wsID, st.Copy.Blob); err != nil {
			if errdefs.IsNotFound(err) {
				return Result{}, fmt.Errorf("recipe: steps[%d]: blob %s of copy %s was not uploaded by this workspace: %w",
					i, st.Copy.Blob, st.Copy.Src, errdefs.ErrFailedPrecondition)
			}
			return Result{}, err
		}
	}
	base, baseDigest, err := s.resolveBase(ctx, wsID, r.Base)
	if err != nil {
		return Result{}, err
	}
	keys, err := recipe.StepKeys(r, baseDigest)
	if err != nil {
		return Result{}, fmt.Errorf("recipe: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	hash, err := recipe.Hash(r, baseDigest)
	if err != nil {
		return Result{}, fmt.Errorf("recipe: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	canonical, err := recipe.Marshal(r)
	if err != nil {
		return Result{}, fmt.Errorf("recipe: %w", err)
	}
	deepest, stepDigest, err := s.d.Store.DeepestImageStep(ctx, wsID, keys)
	if err != nil {
		return Result{}, err
	}
	parent := base
	if deepest >= 0 {
		parent = repo + "@" + stepDigest
	}
	want := store.Image{WorkspaceID: wsID, Hash: hash, Recipe: canonical, Base: base, BaseDigest: baseDigest,
		Steps: len(keys), StartStep: deepest + 1, Parent: parent}
	nonce := make([]byte, 6)
	if _, err := rand.Read(nonce); err != nil {
		return Result{}, fmt.Errorf("build image: %w", err)
	}
	img, dec, err := s.d.Store.BeginImageBuild(ctx, want, force, func(gen int) string { return buildKey(hash, gen, nonce) })
	if err != nil {
		return Result{}, err
	}
	if dec == store.BuildCached {
		return Result{Image: s.pb(img), Cached: true}, nil
	}
	// A joined build whose first caller has not recorded the task yet
	// gets the same task: the key is the build's idempotency key.
	t, _, err := s.d.Tasks.SubmitBuild(ctx, wsID, s.taskSpec(img), img.BuildKey)
	if err != nil {
		s.fail(ctx, img, "could not submit the build task: "+err.Error())
		return Result{}, fmt.Errorf("submit the build of image %s: %w", hash, err)
	}
	if img.TaskID == "" {
		if err := s.d.Store.SetImageTask(ctx, wsID, hash, img.BuildKey, t.GetId()); err != nil {
			return Result{}, err
		}
		img.TaskID = t.GetId()
	}
	s.d.Log.Info("image build", "workspace_id", wsID, "hash", hash, "task_id", img.TaskID, "joined", dec == store.BuildJoined,
		"start_step", img.StartStep, "steps", img.Steps)
	return Result{Image: s.pb(img), Joined: dec == store.BuildJoined}, nil
}

// buildKey is the idempotency key of a build generation's task. The nonce
// matters once an image was deleted: its next build is generation 1 again,
// and the generation alone would name the deleted image's old task, which
// the build would then follow instead of running.
func buildKey(hash string, gen int, nonce []byte) string {
	return fmt.Sprintf("%s%s.%d.%x", tasks.BuildKeyPrefix, recipe.ImageTag(hash), gen, nonce)
}

// taskSpec is the task that runs a build: on the build pool, as root (a
// build installs things), with the recipe's base as its image. Its command
// is not run: the agent runs the steps.
func (s *Service) taskSpec(img store.Image) *v1.TaskSpec {
	pool := "default"
	if _, ok := s.d.Config.Worker.Pools["build"]; ok {
		pool = "build"
	}
	return &v1.TaskSpec{Pool: pool, Image: img.Base, User: "0",
		Command: []string{"levers9-image-build", img.Hash}, Timeout: durationpb.New(buildTimeout), Retries: 1}
}

func (s *Service) fail(ctx context.Context, img store.Image, why string) {
	if _, _, err := s.d.Store.FinishImageBuild(context.WithoutCancel(ctx), img.WorkspaceID, img.Hash, img.BuildKey,
		store.ImageEnd{Error: why, At: s.d.Now()}); err != nil {
		s.d.Log.Warn("could not record a failed image build", "hash", img.Hash, "err", err)
	}
}

// resolveBase resolves the recipe's base to repository@digest: a reference
// without a registry comes from imageService.runner.baseImageRegistry (or
// worker.imageRegistry when that is not set).
func (s *Service) resolveBase(ctx context.Context, wsID, base string) (string, string, error) {
	full := base
	if !hasRegistry(base) {
		reg := s.d.Config.ImageService.Runner.BaseImageRegistry
		if reg == "" {
			reg = s.d.Config.Worker.ImageRegistry
		}
		if reg == "" {
			return "", "", fmt.Errorf("recipe: base %q names no registry and neither imageService.runner.baseImageRegistry nor worker.imageRegistry is set: %w",
				base, errdefs.ErrFailedPrecondition)
		}
		full = reg + "/" + base
	}
	ref, err := name.ParseReference(full)
	if err != nil {
		return "", "", fmt.Errorf("recipe: base %q: %w: %w", base, errdefs.ErrInvalidArgument, err)
	}
	if d, ok := ref.(name.Digest); ok {
		return d.String(), d.DigestStr(), nil
	}
	desc, err := remote.Head(ref, remote.WithContext(ctx), remote.WithAuth(s.auth(ctx, wsID, ref.Context().RegistryStr())))
	if err != nil {
		return "", "", fmt.Errorf("resolve base image %s: %w: %w", full, errdefs.ErrFailedPrecondition, err)
	}
	return ref.Context().Digest(desc.Digest.String()).String(), desc.Digest.String(), nil
}

// hasRegistry reports whether a reference names its registry: a first
// component with '.' or ':', or localhost (the Docker rule).
func hasRegistry(ref string) bool {
	first, _, ok := strings.Cut(ref, "/")
	return ok && (strings.ContainsAny(first, ".:") || first == "localhost")
}

// auth is the workspace's login to a registry, or anonymous.
func (s *Service) auth(ctx context.Context, wsID, host string) authn.Authenticator {
	if s.d.Logins == nil {
		return authn.Anonymous
	}
	user, password, ok, err := s.d.Logins.OpenRegistryLogin(ctx, wsID, host)
	if err != nil || !ok {
		if err != nil {
			s.d.Log.Warn("could not open the workspace's registry login; going anonymous", "host", host, "err", err)
		}
		return authn.Anonymous
	}
	return authn.FromConfig(authn.AuthConfig{Username: user, Password: password})
}

// Get returns a workspace's image, recording its build's end first.
func (s *Service) Get(ctx context.Context, wsID, hash string) (*v1.Image, error) {
	img, err := s.d.Store.GetImage(ctx, wsID, hash)
	if err != nil {
		return nil, err
	}
	img, err = s.settle(ctx, img)
	if err != nil {
		return nil, err
	}
	return s.pb(img), nil
}

// List returns the workspace's images.
func (s *Service) List(ctx context.Context, wsID string) ([]*v1.Image, error) {
	rows, err := s.d.Store.ListImages(ctx, wsID)
	if err != nil {
		return nil, err
	}
	out := make([]*v1.Image, 0, len(rows))
	for _, img := range rows {
		if settled, err := s.settle(ctx, img); err == nil {
			img = settled
		} else {
			s.d.Log.Warn("could not record the end of an image build", "hash", img.Hash, "err", err)
		}
		out = append(out, s.pb(img))
	}
	return out, nil
}

// Delete forgets a workspace's image and its step images.
func (s *Service) Delete(ctx context.Context, wsID, hash string) error {
	img, err := s.d.Store.GetImage(ctx, wsID, hash)
	if err != nil {
		return err
	}
	if img, err = s.settle(ctx, img); err != nil {
		return err
	}
	var keys []string
	if r, err := recipe.Parse(img.Recipe); err == nil {
		keys, _ = recipe.StepKeys(r, img.BaseDigest)
	}
	return s.d.Store.DeleteImage(ctx, wsID, hash, keys)
}

// settle records the end of a BUILDING image whose task has ended: READY
// with the digest the build pushed (and its step images), or FAILED with
// the task's message.
func (s *Service) settle(ctx context.Context, img store.Image) (store.Image, error) {
	if img.State != store.ImageBuilding || img.TaskID == "" {
		return img, nil
	}
	t, err := s.d.Tasks.Get(ctx, img.WorkspaceID, img.TaskID)
	if err != nil {
		return img, err
	}
	switch t.GetState() {
	case v1.TaskState_TASK_STATE_SUCCEEDED:
	case v1.TaskState_TASK_STATE_FAILED, v1.TaskState_TASK_STATE_CANCELLED, v1.TaskState_TASK_STATE_TIMED_OUT:
		why := strings.TrimPrefix(strings.ToLower(t.GetState().String()), "task_state_")
		if t.GetMessage() != "" {
			why += ": " + t.GetMessage()
		}
		return s.finish(ctx, img, store.ImageEnd{Error: "build " + why, At: s.d.Now()})
	default:
		return img, nil
	}
	end, err := s.pushed(ctx, img)
	if err != nil {
		return img, fmt.Errorf("image %s: the build task succeeded but its result cannot be read from the registry: %w: %w",
			img.Hash, errdefs.ErrUnavailable, err)
	}
	return s.finish(ctx, img, end)
}

func (s *Service) finish(ctx context.Context, img store.Image, end store.ImageEnd) (store.Image, error) {
	out, ok, err := s.d.Store.FinishImageBuild(ctx, img.WorkspaceID, img.Hash, img.BuildKey, end)
	if err != nil {
		return img, err
	}
	if !ok {
		// Another caller settled it, or a new generation began.
		return s.d.Store.GetImage(ctx, img.WorkspaceID, img.Hash)
	}
	return out, nil
}

// pushed reads what a successful build pushed: the result (tag <hash
// hex>) and the step images from its start on (tags step-<key hex>).
func (s *Service) pushed(ctx context.Context, img store.Image) (store.ImageEnd, error) {
	repoName, _ := tasks.BuildRepositories(s.d.Config)
	repo, err := name.NewRepository(repoName)
	if err != nil {
		return store.ImageEnd{}, err
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuth(s.auth(ctx, img.WorkspaceID, repo.RegistryStr()))}
	desc, err := remote.Get(repo.Tag(recipe.ImageTag(img.Hash)), opts...)
	if err != nil {
		return store.ImageEnd{}, err
	}
	end := store.ImageEnd{Ready: true, Digest: desc.Digest.String(), Ref: repo.Digest(desc.Digest.String()).String(),
		Steps: map[string]string{}, At: s.d.Now()}
	if m, err := desc.Image(); err == nil {
		if mf, err := m.Manifest(); err == nil {
			end.SizeBytes = mf.Config.Size
			for _, l := range mf.Layers {
				end.SizeBytes += l.Size
			}
		}
	}
	r, err := recipe.Parse(img.Recipe)
	if err != nil {
		return store.ImageEnd{}, fmt.Errorf("stored recipe: %w", err)
	}
	keys, err := recipe.StepKeys(r, img.BaseDigest)
	if err != nil {
		return store.ImageEnd{}, err
	}
	for _, k := range keys[min(img.StartStep, len(keys)):] {
		// A step the build did not push (config-only steps still are)
		// is simply not cached.
		if d, err := remote.Head(repo.Tag(recipe.StepTag(k)), opts...); err == nil {
			end.Steps[k] = d.Digest.String()
		}
	}
	return end, nil
}

func (s *Service) pb(img store.Image) *v1.Image {
	out := &v1.Image{Hash: img.Hash, WorkspaceId: img.WorkspaceID, State: statePB[img.State], Ref: img.Ref, Digest: img.Digest,
		TaskId: img.TaskID, CreatedAt: timestamppb.New(img.CreatedAt), Error: img.Error, Recipe: img.Recipe,
		Steps: int32(img.Steps), CachedSteps: int32(img.StartStep), SizeBytes: img.SizeBytes, Base: img.Base}
	if img.BuiltAt != nil {
		out.BuiltAt = timestamppb.New(*img.BuiltAt)
	}
	return out
}

var statePB = map[store.ImageState]v1.ImageState{
	store.ImageBuilding: v1.ImageState_IMAGE_STATE_BUILDING,
	store.ImageReady:    v1.ImageState_IMAGE_STATE_READY,
	store.ImageFailed:   v1.ImageState_IMAGE_STATE_FAILED,
}

// BlobLimit is the largest blob PutBlob takes.
func (s *Service) BlobLimit() int64 { return s.d.BlobLimit }
