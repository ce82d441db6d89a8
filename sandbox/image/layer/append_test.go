package layer_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/layer"
)

func testTar(t *testing.T, data string) []byte {
	t.Helper()
	b, err := build.TarLayer([]build.File{{Path: "f", Mode: 0o644, Data: []byte(data)}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLayerDeterministicGzip(t *testing.T) {
	tb := testTar(t, strings.Repeat("levers9 ", 1000))
	p := filepath.Join(t.TempDir(), "l.tar")
	if err := os.WriteFile(p, tb, 0o600); err != nil {
		t.Fatal(err)
	}
	l1, err := layer.Layer(p)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := layer.LayerFromBytes(tb)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := l1.Digest()
	d2, _ := l2.Digest()
	if d1 != d2 {
		t.Fatalf("Layer and LayerFromBytes digests differ: %s vs %s", d1, d2)
	}
	rc, err := l1.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	gz, err := io.ReadAll(rc)
	_ = rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	// RFC 1952: flags (byte 3) with no name or comment, mtime (4..7) zero.
	if gz[3] != 0 || !bytes.Equal(gz[4:8], []byte{0, 0, 0, 0}) {
		t.Fatalf("gzip header % x carries a name or time", gz[:10])
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil || !bytes.Equal(raw, tb) {
		t.Fatalf("compressed layer does not hold the tar (%v)", err)
	}
	diffID, _ := l1.DiffID()
	if want, _, _ := v1.SHA256(bytes.NewReader(tb)); diffID != want {
		t.Fatalf("diff ID %s, want %s", diffID, want)
	}
	if _, err := layer.Layer(filepath.Join(t.TempDir(), "missing.tar")); err == nil {
		t.Fatal("Layer of a missing file succeeded")
	}
}

func TestAppend(t *testing.T) {
	la, err := layer.LayerFromBytes(testTar(t, "a"))
	if err != nil {
		t.Fatal(err)
	}
	lb, err := layer.LayerFromBytes(testTar(t, "b"))
	if err != nil {
		t.Fatal(err)
	}
	parentCF := &v1.ConfigFile{
		OS: "linux", Architecture: "amd64",
		Created: v1.Time{Time: time.Date(2023, 1, 1, 0, 0, 0, 0, time.UTC)},
		Config:  v1.Config{Env: []string{"PATH=/bin", "HOME=/root"}, Cmd: []string{"/bin/sh"}, WorkingDir: "/srv"},
		History: []v1.History{{CreatedBy: "base"}},
	}
	parent, err := mutate.ConfigFile(empty.Image, parentCF)
	if err != nil {
		t.Fatal(err)
	}
	steps := func() []layer.AppendStep {
		return []layer.AppendStep{
			{Layer: la, CreatedBy: "run: make a"},
			{Config: layer.ConfigChange{Env: map[string]string{"PATH": "/usr/bin:/bin", "Z": "26", "A": "1"}, Workdir: "app"}, CreatedBy: "env"},
			{Layer: lb, Config: layer.ConfigChange{User: "1000:1000", SetEntrypoint: true, Entrypoint: []string{"python", "main.py"}}, CreatedBy: "run: make b"},
		}
	}
	img, err := layer.Append(parent, steps())
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if want := []string{"PATH=/usr/bin:/bin", "HOME=/root", "A=1", "Z=26"}; !slices.Equal(c.Env, want) {
		t.Errorf("env %q, want %q", c.Env, want)
	}
	if c.WorkingDir != "/srv/app" || c.User != "1000:1000" {
		t.Errorf("workdir %q user %q", c.WorkingDir, c.User)
	}
	if !slices.Equal(c.Entrypoint, []string{"python", "main.py"}) || c.Cmd != nil {
		t.Errorf("entrypoint %q cmd %q: setting the entrypoint alone clears the command", c.Entrypoint, c.Cmd)
	}
	if !cf.Created.Equal(time.Unix(0, 0)) {
		t.Errorf("config created %v", cf.Created)
	}
	if len(cf.History) != 4 || cf.History[0].CreatedBy != "base" {
		t.Fatalf("history %+v", cf.History)
	}
	for i, h := range cf.History[1:] {
		if !h.Created.Equal(time.Unix(0, 0)) || h.CreatedBy != steps()[i].CreatedBy || h.EmptyLayer != (i == 1) {
			t.Errorf("history[%d] = %+v", i+1, h)
		}
	}
	if len(cf.RootFS.DiffIDs) != 2 {
		t.Fatalf("diff IDs %v", cf.RootFS.DiffIDs)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 2 || m.Layers[0].MediaType != types.DockerLayer {
		t.Fatalf("manifest layers %+v", m.Layers)
	}

	// Same inputs, same digest; a different CreatedBy, another digest.
	again, err := layer.Append(parent, steps())
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Fatalf("Append digests differ: %s vs %s", d1, d2)
	}
	s := steps()
	s[1].CreatedBy = "env 2"
	other, err := layer.Append(parent, s)
	if err != nil {
		t.Fatal(err)
	}
	if d3, _ := other.Digest(); d3 == d1 {
		t.Fatal("a different history gave the same digest")
	}

	// AppendAt stamps its epoch; an OCI parent gets OCI layers.
	sde := time.Date(2024, 2, 3, 4, 5, 6, 7, time.UTC)
	ociImg, err := layer.AppendAt(mutate.MediaType(parent, types.OCIManifestSchema1), sde, steps())
	if err != nil {
		t.Fatal(err)
	}
	ocf, _ := ociImg.ConfigFile()
	if !ocf.Created.Equal(sde.Truncate(time.Second)) || !ocf.History[1].Created.Equal(sde.Truncate(time.Second)) {
		t.Errorf("AppendAt times %v %v", ocf.Created, ocf.History[1].Created)
	}
	om, _ := ociImg.Manifest()
	if om.Layers[0].MediaType != types.OCILayer || om.Layers[1].MediaType != types.OCILayer {
		t.Errorf("OCI parent layer media types %s %s", om.Layers[0].MediaType, om.Layers[1].MediaType)
	}
}

func TestAppendEntrypointAndCmd(t *testing.T) {
	img, err := layer.Append(empty.Image, []layer.AppendStep{
		{Config: layer.ConfigChange{SetCmd: true, Cmd: []string{"serve"}}},
		{Config: layer.ConfigChange{SetEntrypoint: true, Entrypoint: []string{"app"}, SetCmd: true, Cmd: []string{"--port", "80"}}},
		{Config: layer.ConfigChange{Workdir: "/a"}},
		{Config: layer.ConfigChange{Workdir: "b/../c"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	if !slices.Equal(cf.Config.Entrypoint, []string{"app"}) || !slices.Equal(cf.Config.Cmd, []string{"--port", "80"}) || cf.Config.WorkingDir != "/a/c" {
		t.Fatalf("config %+v", cf.Config)
	}
	if m, _ := img.Manifest(); len(m.Layers) != 0 {
		t.Fatalf("config-only steps added layers: %+v", m.Layers)
	}
}

func TestAppendValidates(t *testing.T) {
	_, err := layer.Append(empty.Image, []layer.AppendStep{
		{Config: layer.ConfigChange{Env: map[string]string{"A=B": "x", "": "y"}}},
		{Config: layer.ConfigChange{User: "a\x00b"}},
	})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("err = %v, want invalid argument", err)
	}
	for _, want := range []string{`steps[0].config.env[""]`, `steps[0].config.env["A=B"]`, `steps[1].config.user`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// TestLayerOfEmptyUpper: a step that changed nothing still gives a valid,
// reproducible (empty) layer.
func TestLayerOfEmptyUpper(t *testing.T) {
	var b bytes.Buffer
	if err := layer.FromUpper(t.Context(), t.TempDir(), &b, layer.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tar.NewReader(bytes.NewReader(b.Bytes())).Next(); err != io.EOF {
		t.Fatalf("empty upper: first entry err = %v, want EOF", err)
	}
	if b.Len() != 1024 {
		t.Fatalf("empty tar is %d bytes, want 1024", b.Len())
	}
}
