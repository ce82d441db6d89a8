package taskrun

import (
	"context"
	"fmt"
	"sync"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image"
)

// imageHook pulls the task's image through the node's cache (no network
// when a digest is cached) with the attempt's registry login if it has one, checks the user resolves in it, and gives the
// attempt its own overlay rootfs; Stop unmounts it.
type imageHook struct {
	store *image.Store

	// mu guards the fields below, which make Prestart and Stop idempotent.
	mu      sync.Mutex
	img     *image.Image
	rootfs  string
	cleanup func() error
}

var (
	_ Prestarter  = (*imageHook)(nil)
	_ besideImage = (*imageHook)(nil)
	_ Exiter      = (*imageHook)(nil)
	_ Stopper     = (*imageHook)(nil)
)

func (*imageHook) besideImage() {}

func newImageHook(store *image.Store) *imageHook { return &imageHook{store: store} }

func (h *imageHook) Name() string { return "image" }

func (h *imageHook) Prestart(ctx context.Context, req *PrestartRequest, resp *PrestartResponse) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cleanup != nil {
		resp.Image, resp.Rootfs = h.img, h.rootfs
		return nil
	}
	// A nil StaticKeychain answers "no credentials": the store's own
	// keychain is asked next.
	img, err := h.store.PullWith(ctx, req.Task.Image, req.Task.RegistryAuth)
	if err != nil {
		return pullReason(req.Task.Image, h.store.RegistryOf(req.Task.Image), fmt.Errorf("pull image %s: %w", req.Task.Image, err))
	}
	rootfs, cleanup, err := h.store.Mount(ctx, img.Digest, req.Task.runID())
	if err != nil {
		return withReason(ReasonMountFailed, "the image's filesystem could not be mounted on this machine",
			fmt.Errorf("mount image %s: %w", img.Digest, err))
	}
	user := req.Task.User
	if user == "" {
		user = img.Config.User
	}
	if _, err := image.ResolveUser(rootfs, user); err != nil {
		_ = cleanup()
		return errdefs.WithRetry(fmt.Errorf("image %s: user %q: %w: %w", img.Digest, user, err, errdefs.ErrInvalidArgument), false)
	}
	h.img, h.rootfs, h.cleanup = &img, rootfs, cleanup
	resp.Image, resp.Rootfs = h.img, rootfs
	return nil
}

// Exited hands a build step's changes to its Capture while the container's
// process is gone and the overlay still mounted (the upper directory is
// quiescent and complete).
func (h *imageHook) Exited(ctx context.Context, req *ExitedRequest, _ *ExitedResponse) error {
	if req.Task.Build == nil || req.Task.Build.Capture == nil || req.Exit.Code != 0 || req.Exit.Signal != 0 {
		return nil
	}
	h.mu.Lock()
	mounted := h.cleanup != nil
	h.mu.Unlock()
	if !mounted {
		return fmt.Errorf("capture build step %s: its rootfs is not mounted", req.Task.runID())
	}
	if err := req.Task.Build.Capture(ctx, h.store.UpperDir(req.Task.runID())); err != nil {
		return fmt.Errorf("capture build step %s: %w", req.Task.runID(), err)
	}
	return nil
}

func (h *imageHook) Stop(ctx context.Context, req *StopRequest) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cleanup == nil {
		return nil
	}
	if err := h.cleanup(); err != nil {
		return fmt.Errorf("unmount rootfs of %s: %w", req.ContainerID, err)
	}
	h.cleanup = nil
	return nil
}

// adopt makes Stop release a rootfs an earlier agent mounted.
func (h *imageHook) adopt(cleanup func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cleanup = cleanup
}
