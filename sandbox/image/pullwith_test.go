package image_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/sandbox/image/build"
)

// TestPullWithOnePullsCredentials: credentials given to one pull serve that
// pull only. A later pull without them is refused, by tag and by digest,
// even though the image is cached (a cached private image must not be handed
// to whoever names its digest), and nothing on disk holds the password.
func TestPullWithOnePullsCredentials(t *testing.T) {
	t.Parallel()
	const user, password = "l9i-user", "s3cret-l9i-pullwith"
	b := setup(t, setupOpts{users: map[string]string{user: password}})
	ctx := testCtx(t)
	res, err := build.BuildBusybox(ctx, b.reg.Host, "l9i/private", "v1", nil, build.Options{Username: user, Password: password})
	if err != nil {
		t.Fatalf("push with credentials: %v", err)
	}
	kc := image.StaticKeychain{b.reg.Host: {Username: user, Password: password}}
	img, err := b.store.PullWith(ctx, "l9i/private:v1", kc)
	if err != nil || img.Digest != res.Digest {
		t.Fatalf("PullWith(credentials) = %+v, %v", img, err)
	}
	// The digest again, with the credentials: served (a check with the
	// registry, then the cache).
	if _, err := b.store.PullWith(ctx, res.DigestRef, kc); err != nil {
		t.Fatalf("PullWith(digest, credentials) = %v", err)
	}
	for _, ref := range []string{"l9i/private:v1", res.DigestRef} {
		_, err := b.store.Pull(ctx, ref)
		if !errors.Is(err, image.ErrAccessRefused) || !errdefs.IsUnauthenticated(err) {
			t.Errorf("Pull(%s) without credentials after a pull with them = %v, want the registry's refusal", ref, err)
		}
		wrong := image.StaticKeychain{b.reg.Host: {Username: user, Password: "wrong-" + password}}
		_, err = b.store.PullWith(ctx, ref, wrong)
		if !errors.Is(err, image.ErrAccessRefused) {
			t.Errorf("PullWith(%s, wrong password) = %v, want the registry's refusal", ref, err)
		}
		if err != nil && strings.Contains(err.Error(), password) {
			t.Errorf("error reveals the password: %v", err)
		}
	}
	if strings.Contains(b.logs.String(), password) {
		t.Errorf("logs reveal the password")
	}
	_ = filepath.WalkDir(b.root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if data, err := os.ReadFile(p); err == nil && strings.Contains(string(data), password) {
			t.Errorf("%s holds the password", p)
		}
		return nil
	})
}
