package main

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/benchstack"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/recipe"
	"github.com/levers9/levers9/sdk"
)

// copyBytes is the size of the random file the copy step copies (and the
// pre-pushed image's matching layer holds).
const copyBytes = 256 << 10

// ranLine is what the run step prints once its command has run.
const ranLine = "step-ran"

// phaseNames name the parts of a cold build, in order: the client's
// call, then the spans between the build's log lines (the agent's clock).
var phaseNames = []string{
	"pack+upload+submit",
	"to step 1 (queue, dispatch, parent)",
	"env",
	"copy (blob, layer, push)",
	"run (pull, unpack, start, command)",
	"capture+pushes",
	"to ready (report, record)",
}

// markers are the build log lines that end the phases after submit,
// except the last (READY).
var markers = []string{"step 1/3: ", "step 2/3: ", "step 3/3: ", ranLine, "image "}

// bench is what the rounds share.
type bench struct {
	s         *benchstack.Stack
	c         *sdk.Client
	bare      *benchstack.Bundle
	baseLayer []byte
}

// buildTimes is one cold build: its total and its phases.
type buildTimes struct {
	total  time.Duration
	phases []time.Duration
}

// recipe writes the round's copy source under a directory of its own and
// returns the round's recipe (every step carrying the nonce) and that
// directory.
func (b *bench) recipe(nonce string) (*recipe.Recipe, string, error) {
	dir := filepath.Join(b.s.Work, "src", nonce)
	if err := writeApp(dir, nonce); err != nil {
		return nil, "", fmt.Errorf("copy source: %w", err)
	}
	r, err := sdk.NewImage(b.s.Image).
		Env("BENCH_NONCE", nonce).
		Copy("app", "/app").
		Run(fmt.Sprintf("echo %s > /built.txt && echo %s", nonce, ranLine)).
		Recipe()
	if err != nil {
		return nil, "", fmt.Errorf("recipe: %w", err)
	}
	return r, dir, nil
}

// coldBuild builds r, which must be new, follows its task and returns the
// image once Client.Image says READY.
func (b *bench) coldBuild(ctx context.Context, r *recipe.Recipe, dir string) (*v1.Image, buildTimes, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	start := time.Now()
	resp, err := b.c.BuildImage(ctx, r, dir, false, nil)
	if err != nil {
		return nil, buildTimes{}, err
	}
	submitted := time.Now()
	if resp.Cached || resp.Joined || resp.GetImage().GetCachedSteps() != 0 {
		return nil, buildTimes{}, fmt.Errorf("image %s was not built cold (cached %v, joined %v, %d steps reused)",
			resp.GetImage().GetHash(), resp.Cached, resp.Joined, resp.GetImage().GetCachedSteps())
	}
	hash, taskID := resp.Image.Hash, resp.Image.TaskId
	marks := make([]time.Time, len(markers))
	var logTail []string
	err = b.c.Follow(ctx, taskID, "", func(ev *sdk.TaskEvent) error {
		l := ev.GetLog()
		if l == nil {
			return nil
		}
		logTail = append(logTail, l.Text)
		for i, m := range markers {
			if marks[i].IsZero() && strings.HasPrefix(l.Text, m) {
				marks[i] = ev.GetTime().AsTime()
			}
		}
		return nil
	})
	if err != nil {
		return nil, buildTimes{}, fmt.Errorf("follow build task %s of image %s: %w", taskID, hash, err)
	}
	var img *v1.Image
	for {
		if img, err = b.c.Image(ctx, hash); err != nil {
			return nil, buildTimes{}, fmt.Errorf("image %s: %w", hash, err)
		}
		if img.State != v1.ImageState_IMAGE_STATE_BUILDING {
			break
		}
		select {
		case <-ctx.Done():
			return nil, buildTimes{}, fmt.Errorf("image %s still building after its task %s ended: %w", hash, taskID, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	ready := time.Now()
	if img.State != v1.ImageState_IMAGE_STATE_READY {
		return nil, buildTimes{}, fmt.Errorf("image %s: %s: %s\nbuild log:\n%s", hash, img.State, img.Error, strings.Join(logTail, "\n"))
	}
	points := append([]time.Time{start, submitted}, marks...)
	points = append(points, ready)
	bt := buildTimes{total: ready.Sub(start)}
	for i := 1; i < len(points); i++ {
		if points[i].IsZero() {
			return nil, buildTimes{}, fmt.Errorf("image %s: the build log has no line starting %q:\n%s", hash, markers[i-2], strings.Join(logTail, "\n"))
		}
		bt.phases = append(bt.phases, points[i].Sub(points[i-1]))
	}
	return img, bt, nil
}

// cachedBuild builds r again and returns how long BuildImage took to
// answer Cached.
func (b *bench) cachedBuild(ctx context.Context, r *recipe.Recipe, dir, hash string) (time.Duration, error) {
	start := time.Now()
	resp, err := b.c.BuildImage(ctx, r, dir, false, nil)
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	if !resp.Cached || resp.GetImage().GetHash() != hash || resp.GetImage().GetState() != v1.ImageState_IMAGE_STATE_READY {
		return 0, fmt.Errorf("image %s: the same recipe again was no cache hit (cached %v, hash %s, state %s)",
			hash, resp.Cached, resp.GetImage().GetHash(), resp.GetImage().GetState())
	}
	return d, nil
}

// busyboxLayer is the uncompressed layer of the base image (the same bytes
// BuildBusybox pushed, so the same blob).
func busyboxLayer() ([]byte, error) {
	files, err := build.BusyboxFiles(build.DefaultBusybox)
	if err != nil {
		return nil, err
	}
	l, err := build.TarLayer(files)
	if err != nil {
		return nil, fmt.Errorf("busybox layer: %w", err)
	}
	return l, nil
}

// pushPrepushed pushes an image shaped like the round's build (the base
// layer, a layer like the copy step's with fresh random bytes, one like
// the run step's, the env in its config) and returns its reference by
// digest.
func (b *bench) pushPrepushed(ctx context.Context, r int, nonce string) (string, error) {
	data := make([]byte, copyBytes)
	if _, err := rand.Read(data); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	app, err := build.TarLayer([]build.File{
		{Path: "app", Type: tar.TypeDir, Mode: 0o755},
		{Path: "app/data.bin", Mode: 0o644, Data: data},
		{Path: "app/nonce.txt", Mode: 0o644, Data: []byte(nonce + "\n")},
	})
	if err != nil {
		return "", err
	}
	ran, err := build.TarLayer([]build.File{{Path: "built.txt", Mode: 0o644, Data: []byte(nonce + "\n")}})
	if err != nil {
		return "", err
	}
	res, err := build.Push(ctx, b.s.Registry.Addr(), "levers9/prepushed", fmt.Sprintf("r%d-%s", r, nonce), [][]byte{b.baseLayer, app, ran},
		build.Options{Config: build.Config{Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "BENCH_NONCE=" + nonce}}})
	if err != nil {
		return "", err
	}
	return res.DigestRef, nil
}

// sizesOf describes the compressed sizes of the two images as their
// manifests give them.
func sizesOf(ctx context.Context, built, prepushed string) (string, error) {
	var parts []string
	for _, x := range []struct{ what, ref string }{{"built", built}, {"pre-pushed", prepushed}} {
		ref, err := name.ParseReference(x.ref)
		if err != nil {
			return "", fmt.Errorf("%s image %s: %w", x.what, x.ref, err)
		}
		img, err := remote.Image(ref, remote.WithContext(ctx))
		if err != nil {
			return "", fmt.Errorf("%s image %s: %w", x.what, x.ref, err)
		}
		m, err := img.Manifest()
		if err != nil {
			return "", fmt.Errorf("%s image %s: manifest: %w", x.what, x.ref, err)
		}
		var size int64
		for _, l := range m.Layers {
			size += l.Size
		}
		parts = append(parts, fmt.Sprintf("%s %d KiB in %d layers", x.what, size>>10, len(m.Layers)))
	}
	return strings.Join(parts, ", ") + " (compressed; the base layer is shared)", nil
}
