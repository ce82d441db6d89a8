package taskrun

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
)

// TestImageHookIdempotent: Prestart twice gives the same mounted rootfs,
// Stop twice unmounts it once, and a user missing from the image fails
// Prestart without leaving a mount.
func TestImageHookIdempotent(t *testing.T) {
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	tk := b.task("img", "true")
	req := &PrestartRequest{Task: tk, ContainerID: b.sb.ContainerID(tk.runID())}
	h := newImageHook(b.store)
	var first, second PrestartResponse
	if err := h.Prestart(ctx, req, &first); err != nil {
		t.Fatal(err)
	}
	if err := h.Prestart(ctx, req, &second); err != nil {
		t.Fatal(err)
	}
	if first.Rootfs == "" || first.Rootfs != second.Rootfs || second.Image == nil || second.Image.Digest != b.image.Digest {
		t.Fatalf("Prestart twice: %+v then %+v", first, second)
	}
	if _, err := os.Stat(filepath.Join(first.Rootfs, "bin", "busybox")); err != nil {
		t.Fatalf("rootfs not mounted: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := h.Stop(ctx, &StopRequest{Task: tk, ContainerID: req.ContainerID}); err != nil {
			t.Fatalf("Stop %d: %v", i, err)
		}
	}
	b.assertClean(t, tk)

	bad := b.task("img-user", "true")
	bad.User = "nobody-here"
	h = newImageHook(b.store)
	var resp PrestartResponse
	err := h.Prestart(ctx, &PrestartRequest{Task: bad, ContainerID: "l9r-img-user.1"}, &resp)
	if !errdefs.IsInvalidArgument(err) || errdefs.IsRetryable(err) || !contains(err.Error(), "nobody-here") {
		t.Errorf("missing user: %v, want a non-retryable invalid argument naming it", err)
	}
	if err := h.Stop(context.Background(), &StopRequest{Task: bad}); err != nil {
		t.Fatal(err)
	}
	b.assertClean(t, bad)
}
