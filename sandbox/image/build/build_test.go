package build_test

import (
	"archive/tar"
	"context"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/imagetest"
)

func TestBuildBusyboxPushesAReproducibleImage(t *testing.T) {
	t.Parallel()
	reg := imagetest.StartRegistry(t, imagetest.RegistryOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	extra := []build.File{{Path: "usr/bin/probe", Mode: 0o755, Data: []byte("probe")}}
	opts := build.Options{Config: build.Config{Entrypoint: []string{"/usr/bin/probe"}, User: "65534", WorkingDir: "/tmp"}}
	first, err := build.BuildBusybox(ctx, reg.Host, "l9i/demo", "v1", extra, opts)
	if err != nil {
		t.Fatalf("BuildBusybox: %v", err)
	}
	second, err := build.BuildBusybox(ctx, reg.Host, "l9i/demo", "v2", extra, opts)
	if err != nil {
		t.Fatalf("BuildBusybox again: %v", err)
	}
	if first.Digest != second.Digest {
		t.Errorf("equal inputs gave digests %s and %s", first.Digest, second.Digest)
	}

	ref, err := name.ParseReference(first.DigestRef)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("read back %s: %v", first.DigestRef, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || !slices.Equal(cf.Config.Entrypoint, []string{"/usr/bin/probe"}) || cf.Config.User != "65534" || cf.Config.WorkingDir != "/tmp" || len(cf.Config.Env) == 0 {
		t.Errorf("config = %+v", cf.Config)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers = %d, %v; want busybox + extra", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	seen := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[hdr.Name] = hdr
	}
	if h := seen["bin/busybox"]; h == nil || h.Mode != 0o755 || h.Size == 0 {
		t.Errorf("bin/busybox = %+v", h)
	}
	for _, a := range []string{"sh", "echo", "cat", "ls", "ping", "sleep"} {
		if h := seen["bin/"+a]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
			t.Errorf("bin/%s = %+v, want a symlink to busybox", a, h)
		}
	}
	if h := seen["tmp/"]; h == nil || h.Mode != 0o1777 {
		t.Errorf("tmp/ = %+v, want mode 1777", h)
	}
}

func TestBuildBusyboxMissingBinary(t *testing.T) {
	t.Parallel()
	_, err := build.BuildBusybox(context.Background(), "127.0.0.1:1", "l9i/x", "v1", nil, build.Options{Busybox: "/nonexistent/l9i-busybox"})
	if err == nil {
		t.Fatal("BuildBusybox with a missing busybox succeeded")
	}
}
