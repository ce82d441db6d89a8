package layer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/imagetest"
	"github.com/levers9/levers9/sandbox/image/layer"
)

// TestRoundTrip runs a build step the way a build does: the image store
// pulls the base from a real registry and mounts it for the step (its
// tasks/<id>/upper is the step's upper directory); the step's layer is
// appended to the base and pushed; the store pulls and mounts the result,
// which must show the same tree as the step's merged view, minus the
// excluded paths.
func TestRoundTrip(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := imagetest.StartRegistry(t, imagetest.RegistryOptions{})
	baseTar, err := build.TarLayer(lowerFiles)
	if err != nil {
		t.Fatal(err)
	}
	base, err := build.Push(ctx, reg.Host, "l9l/base", "v1", [][]byte{baseTar}, build.Options{Config: build.Config{Env: []string{"PATH=/bin", "HOME=/root"}}})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	store, err := image.New(image.Config{Root: root, Registry: reg.Host, InsecureRegistries: []string{reg.Host}, MountSource: mountSource, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Reconcile(context.Background(), nil) })

	baseImg, err := store.Pull(ctx, base.DigestRef)
	if err != nil {
		t.Fatalf("pull base: %v", err)
	}
	merged, cleanup, err := store.Mount(ctx, baseImg.Digest, "step1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cleanup() })
	buildStep(t, merged, false)

	var tarBuf bytes.Buffer
	if err := layer.FromUpper(ctx, filepath.Join(root, "tasks", "step1", "upper"), &tarBuf, layer.Options{Exclude: excludes}); err != nil {
		t.Fatal(err)
	}
	l, err := layer.LayerFromBytes(tarBuf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	parentRef, err := name.ParseReference(base.DigestRef, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	parent, err := remote.Image(parentRef, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	img, err := layer.Append(parent, []layer.AppendStep{
		{Layer: l, CreatedBy: "run: build step"},
		{Config: layer.ConfigChange{Env: map[string]string{"HOME": "/app", "LANG": "C.UTF-8"}, Workdir: "/app"}, CreatedBy: "env"},
	})
	if err != nil {
		t.Fatal(err)
	}
	childRef, err := name.NewTag(reg.Host+"/l9l/child:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(childRef, img, remote.WithContext(ctx)); err != nil {
		t.Fatalf("push child: %v", err)
	}
	childImg, err := store.Pull(ctx, childRef.Name())
	if err != nil {
		t.Fatalf("pull child: %v", err)
	}
	if want := []string{"PATH=/bin", "HOME=/app", "LANG=C.UTF-8"}; !slices.Equal(childImg.Config.Env, want) {
		t.Errorf("child env %q, want %q", childImg.Config.Env, want)
	}
	if childImg.Config.WorkingDir != "/app" {
		t.Errorf("child workdir %q", childImg.Config.WorkingDir)
	}
	check, cleanup2, err := store.Mount(ctx, childImg.Digest, "check")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cleanup2() })

	want := describeTree(t, merged, excludes)
	got := describeTree(t, check, nil)
	if !slices.Equal(got, want) {
		t.Fatalf("pulled image differs from the step's merged view:\n%s", diffLines(got, want))
	}
	for _, p := range []string{"run/levers9", "etc/resolv.conf", "gone.txt", "data/old1", "data/sub"} {
		if _, err := os.Lstat(filepath.Join(check, p)); !os.IsNotExist(err) {
			t.Errorf("%s in the pulled image: %v", p, err)
		}
	}
	t.Logf("%d paths match; layer tar %d bytes", len(got), tarBuf.Len())
}

// describeTree lists every path below root (symlinks not followed) with
// type, mode, owner, content hash or link target, file capabilities and
// hard link group. The image store's unpacker applies security.capability
// only, so other xattrs are not compared (the tar's are checked elsewhere).
func describeTree(t *testing.T, root string, exclude []string) []string {
	t.Helper()
	var out []string
	links := map[uint64]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		for _, x := range exclude {
			x = strings.TrimPrefix(x, "/")
			if rel == x || strings.HasPrefix(rel, x+"/") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s mode=%o uid=%d gid=%d", rel, st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" sha=%x", sha256.Sum256(b))
			if st.Nlink > 1 {
				if _, ok := links[st.Ino]; !ok {
					links[st.Ino] = rel
				}
				line += " linkgroup=" + links[st.Ino]
			}
			if v, err := getxattr(p, "security.capability"); err == nil {
				line += fmt.Sprintf(" cap=%x", v)
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += " -> " + target
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffLines(got, want []string) string {
	var b strings.Builder
	for _, w := range want {
		if !slices.Contains(got, w) {
			fmt.Fprintf(&b, "  missing: %s\n", w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			fmt.Fprintf(&b, "  extra:   %s\n", g)
		}
	}
	return b.String()
}
