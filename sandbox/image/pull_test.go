package image_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/imagetest"
)

func TestPull(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	pushed := pushBusybox(t, b.reg.Host, "l9i/busybox", "v1", []build.File{
		{Path: "usr/bin/probe", Mode: 0o4755, Data: []byte("#!/bin/sh\necho probe\n")},
	})
	img, err := b.store.Pull(ctx, "l9i/busybox:v1")
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	if img.Digest != pushed.Digest {
		t.Errorf("Digest = %s, want the pushed %s", img.Digest, pushed.Digest)
	}
	if !slices.Equal(img.Config.Cmd, []string{"/bin/sh"}) || len(img.Config.Env) == 0 {
		t.Errorf("Config = %+v, want Cmd [/bin/sh] and a PATH", img.Config)
	}
	if len(img.Layers) != 2 {
		t.Errorf("Layers = %v, want 2", img.Layers)
	}
	if link, err := os.Readlink(filepath.Join(img.RootFS, "bin/sh")); err != nil || link != "busybox" {
		t.Errorf("bin/sh -> %q, %v; want busybox", link, err)
	}
	st, err := os.Stat(filepath.Join(img.RootFS, "usr/bin/probe"))
	if err != nil || st.Mode()&os.ModeSetuid == 0 || st.Mode().Perm() != 0o755 {
		t.Errorf("usr/bin/probe mode = %v, %v; want setuid 0755", st.Mode(), err)
	}
	if st, err := os.Stat(filepath.Join(img.RootFS, "tmp")); err != nil || st.Mode()&os.ModeSticky == 0 {
		t.Errorf("tmp mode = %v, %v; want sticky", st.Mode(), err)
	}
	for _, d := range append([]string{img.Digest}, img.Layers...) {
		p := filepath.Join(b.root, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o644 {
			t.Errorf("blob %s: %v, %v; want a 0644 file", d, st, err)
		}
	}
	if got := metricValue(t, b.metrics, "levers9_image_pulls_total", map[string]string{"result": "fetched"}); got != 1 {
		t.Errorf("fetched pulls = %v, want 1", got)
	}
	if got := metricValue(t, b.metrics, "levers9_image_pulled_bytes_total", nil); got <= 0 {
		t.Errorf("pulled bytes = %v, want > 0", got)
	}

	// The same tag again resolves the tag but downloads nothing.
	again, err := b.store.Pull(ctx, b.reg.Host+"/l9i/busybox:v1")
	if err != nil || again.Digest != img.Digest || again.RootFS != img.RootFS {
		t.Fatalf("second Pull = %+v, %v; want the same image", again, err)
	}
	if got := metricValue(t, b.metrics, "levers9_image_cache_hits_total", nil); got != 1 {
		t.Errorf("cache hits = %v, want 1", got)
	}
	if got, err := b.store.Get(ctx, img.Digest); err != nil || got.Digest != img.Digest {
		t.Errorf("Get(%s) = %+v, %v", img.Digest, got, err)
	}
}

func TestPullCacheHitWithoutNetwork(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	pushed := pushBusybox(t, b.reg.Host, "l9i/offline", "v1", nil)
	if _, err := b.store.Pull(ctx, "l9i/offline:v1"); err != nil {
		t.Fatalf("Pull: %v", err)
	}
	b.reg.Stop()
	if err := b.reg.WaitGone(ctx); err != nil {
		t.Fatal(err)
	}

	// A cached digest needs no network even for an online store.
	if img, err := b.store.Pull(ctx, "l9i/offline@"+pushed.Digest); err != nil || img.Digest != pushed.Digest {
		t.Errorf("Pull by digest with the registry gone = %+v, %v", img, err)
	}
	// An online store must not serve a tag from the cache: the tag may have moved.
	if _, err := b.store.Pull(ctx, "l9i/offline:v1"); !errdefs.IsUnavailable(err) {
		t.Errorf("online Pull by tag with the registry gone = %v, want unavailable", err)
	}

	offline, _ := b.newStore(t, func(c *image.Config) { c.Offline = true })
	tests := []struct {
		ref     string
		wantErr func(error) bool
	}{
		{ref: "l9i/offline:v1"},
		{ref: b.reg.Host + "/l9i/offline:v1"},
		{ref: "l9i/offline@" + pushed.Digest},
		{ref: "l9i/offline:never-pulled", wantErr: errdefs.IsUnavailable},
		{ref: "l9i/other@sha256:" + strings.Repeat("0", 64), wantErr: errdefs.IsUnavailable},
	}
	for _, tt := range tests {
		img, err := offline.Pull(ctx, tt.ref)
		if tt.wantErr != nil {
			if !tt.wantErr(err) {
				t.Errorf("offline Pull(%s) = %v, want the error kind", tt.ref, err)
			}
			continue
		}
		if err != nil || img.Digest != pushed.Digest {
			t.Errorf("offline Pull(%s) = %+v, %v; want %s", tt.ref, img, err, pushed.Digest)
		}
	}
}

func TestPullDigestMismatchRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		tamper func(t *testing.T, b *bundle, layer string) *image.Store
	}{
		{
			name: "blob tampered in registry storage",
			tamper: func(t *testing.T, b *bundle, layer string) *image.Store {
				p := b.reg.BlobPath(layer)
				data, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				data[len(data)/2] ^= 0xff
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
				return b.store
			},
		},
		{
			name: "proxy corrupts bytes in flight",
			tamper: func(t *testing.T, b *bundle, layer string) *image.Store {
				proxy := imagetest.StartProxy(t, b.reg.Host)
				proxy.Corrupt(layer)
				s, _ := b.newStore(t, func(c *image.Config) {
					c.Registry, c.InsecureRegistries = proxy.Host, []string{proxy.Host}
				})
				return s
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			ctx := testCtx(t)
			pushed := pushBusybox(t, b.reg.Host, "l9i/tamper", "v1", []build.File{{Path: "x", Mode: 0o644, Data: []byte("x")}})
			desc := manifestLayers(t, b.reg.Host, pushed.DigestRef)
			layer := desc[1]
			s := tt.tamper(t, b, layer)
			_, err := s.Pull(ctx, "l9i/tamper:v1")
			if !errors.Is(err, image.ErrDigestMismatch) || !strings.Contains(err.Error(), layer) {
				t.Fatalf("Pull = %v, want ErrDigestMismatch naming %s", err, layer)
			}
			if _, err := os.Stat(filepath.Join(b.root, "blobs", "sha256", strings.TrimPrefix(layer, "sha256:"))); !os.IsNotExist(err) {
				t.Errorf("tampered blob stored: %v", err)
			}
			if _, err := s.Get(ctx, pushed.Digest); !errdefs.IsNotFound(err) {
				t.Errorf("Get after refused pull = %v, want not found", err)
			}
			if ents, _ := os.ReadDir(filepath.Join(b.root, "tmp")); len(ents) != 0 {
				t.Errorf("tmp not cleaned: %v", ents)
			}
		})
	}
}

func TestPullDeduplicatesConcurrentPulls(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	pushed := pushBusybox(t, b.reg.Host, "l9i/dedup", "v1", []build.File{{Path: "y", Mode: 0o644, Data: []byte("y")}})
	proxy := imagetest.StartProxy(t, b.reg.Host)
	viaProxy := func(c *image.Config) { c.Registry, c.InsecureRegistries = proxy.Host, []string{proxy.Host} }
	// Two Stores on one root stand for two processes: singleflight dedups
	// within each, the digest's file lock across them.
	s1, _ := b.newStore(t, viaProxy)
	s2, _ := b.newStore(t, viaProxy)

	const perStore = 6
	var wg sync.WaitGroup
	errs := make(chan error, 2*perStore)
	digests := make(chan string, 2*perStore)
	for _, s := range []*image.Store{s1, s2} {
		for range perStore {
			wg.Add(1)
			go func() {
				defer wg.Done()
				img, err := s.Pull(ctx, "l9i/dedup:v1")
				errs <- err
				digests <- img.Digest
			}()
		}
	}
	wg.Wait()
	close(errs)
	close(digests)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Pull: %v", err)
		}
	}
	for d := range digests {
		if d != pushed.Digest {
			t.Errorf("Pull digest = %s, want %s", d, pushed.Digest)
		}
	}
	blobs := manifestLayers(t, b.reg.Host, pushed.DigestRef)
	for _, d := range blobs {
		if n := proxy.BlobGets(d); n != 1 {
			t.Errorf("blob %s fetched %d times, want 1", d, n)
		}
	}
	if n := proxy.TotalBlobGets(); n != len(blobs) {
		t.Errorf("blob GETs = %d, want %d (config + layers)", n, len(blobs))
	}
}

func TestPullRefusesUnconfiguredAndPlainHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	pushBusybox(t, b.reg.Host, "l9i/scheme", "v1", nil)
	secure, _ := b.newStore(t, func(c *image.Config) { c.InsecureRegistries = nil })
	tests := []struct {
		name string
		s    *image.Store
		ref  string
		want string
	}{
		{"plain HTTP to a registry not marked insecure", secure, "l9i/scheme:v1", "plain HTTP refused"},
		{"registry not configured", b.store, "registry.invalid/l9i/scheme:v1", "not configured"},
		{"metadata address not configured", b.store, "169.254.169.254/x:v1", "not configured"},
	}
	for _, tt := range tests {
		_, err := tt.s.Pull(ctx, tt.ref)
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Pull(%s) = %v, want permission denied containing %q", tt.name, tt.ref, err, tt.want)
		}
	}
	if _, err := b.store.Pull(ctx, "l9i/scheme:missing"); !errdefs.IsNotFound(err) {
		t.Errorf("Pull of a missing tag = %v, want not found", err)
	}
	if _, err := b.store.Pull(ctx, "Bad Ref"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Pull(bad ref) = %v, want invalid argument", err)
	}
}

func TestPullPrivateRegistry(t *testing.T) {
	t.Parallel()
	const user, password = "l9i-user", "s3cret-l9i-password"
	b := setup(t, setupOpts{users: map[string]string{user: password}})
	ctx := testCtx(t)
	res, err := build.BuildBusybox(ctx, b.reg.Host, "l9i/private", "v1", nil, build.Options{Username: user, Password: password})
	if err != nil {
		t.Fatalf("push with credentials: %v", err)
	}
	if _, err := b.store.Pull(ctx, "l9i/private:v1"); !errdefs.IsUnauthenticated(err) {
		t.Errorf("anonymous Pull = %v, want unauthenticated", err)
	}
	wrong, _ := b.newStore(t, func(c *image.Config) {
		c.Keychain = image.StaticKeychain{b.reg.Host: {Username: user, Password: "wrong-" + password}}
	})
	_, err = wrong.Pull(ctx, "l9i/private:v1")
	if !errdefs.IsUnauthenticated(err) {
		t.Errorf("Pull with a wrong password = %v, want unauthenticated", err)
	}
	if err != nil && strings.Contains(err.Error(), password) {
		t.Errorf("error reveals the password: %v", err)
	}
	good, _ := b.newStore(t, func(c *image.Config) {
		c.Keychain = image.StaticKeychain{b.reg.Host: {Username: user, Password: password}}
	})
	img, err := good.Pull(ctx, "l9i/private:v1")
	if err != nil || img.Digest != res.Digest {
		t.Fatalf("Pull with credentials = %+v, %v", img, err)
	}
	if strings.Contains(b.logs.String(), password) {
		t.Errorf("logs reveal the password")
	}
	creds := image.Credentials{Username: user, Password: password}
	for _, s := range []string{creds.String(), creds.GoString(), creds.LogValue().String()} {
		if strings.Contains(s, password) {
			t.Errorf("Credentials printed as %q", s)
		}
	}
}

func TestUnpackedTreesAreRootOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for dir, want := range map[string]os.FileMode{"rootfs": 0o700, "tasks": 0o700, "tmp": 0o700, "blobs/sha256": 0o755} {
		st, err := os.Stat(filepath.Join(b.root, dir))
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("%s mode = %v, %v; want %v", dir, st.Mode().Perm(), err, want)
		}
	}
}

// TestPullKeepsAnonymousClient: pulls of a tag ask the registry for the
// manifest each time (the tag may move) but find out how to log in once;
// a failed pull forgets the client, so the next one asks again.
func TestPullKeepsAnonymousClient(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := testCtx(t)
	pushBusybox(t, b.reg.Host, "l9i/kept", "v1", nil)
	proxy := imagetest.StartProxy(t, b.reg.Host)
	s, _ := b.newStore(t, func(c *image.Config) { c.Registry, c.InsecureRegistries = proxy.Host, []string{proxy.Host} })
	for i := range 3 {
		if _, err := s.Pull(ctx, "l9i/kept:v1"); err != nil {
			t.Fatalf("Pull %d: %v", i, err)
		}
	}
	if n := proxy.Pings(); n != 1 {
		t.Errorf("3 pulls pinged the registry %d times, want 1", n)
	}
	if _, err := s.Pull(ctx, "l9i/kept:missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("Pull of a missing tag = %v, want not found", err)
	}
	if _, err := s.Pull(ctx, "l9i/kept:v1"); err != nil {
		t.Fatalf("Pull after a failure: %v", err)
	}
	if n := proxy.Pings(); n != 2 {
		t.Errorf("pings after a failed pull and another = %d, want 2", n)
	}
}
