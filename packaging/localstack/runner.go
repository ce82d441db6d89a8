package localstack

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/levers9/levers9/packaging/images/imagebuild"
)

// RunnerEnv set to 0 makes make up skip the runner image (its Debian root
// filesystem takes minutes to build the first time).
const RunnerEnv = "LEVERS9_RUNNER"

// runnerImage is the runner's name in the local registry: image recipes
// and the Python SDK name it without a registry, and
// imageService.runner.baseImageRegistry points them here.
const runnerImage = "levers9-runner"

// ensureRunner builds levers9-runner (Debian with Python 3, from the cached
// mmdebstrap root filesystem) and pushes it to the local registry as
// levers9-runner:latest, unless the registry already holds what the last
// push left there for the same root filesystem.
func ensureRunner(ctx context.Context, p Paths, st *State, out io.Writer, say func(string, ...any)) error {
	if os.Getenv(RunnerEnv) == "0" {
		say("runner image skipped (%s=0): Python functions and recipes based on %s will not find it", RunnerEnv, runnerImage)
		return nil
	}
	host := fmt.Sprintf("127.0.0.1:%d", st.RegistryPort)
	tag, err := name.NewTag(host+"/"+runnerImage+":latest", name.Insecure)
	if err != nil {
		return err
	}
	key := imagebuild.RunnerRootfs(0).Key()
	if st.RunnerRootfs == key && st.RunnerDigest != "" {
		if d, err := remote.Head(tag, remote.WithContext(ctx)); err == nil && d.Digest.String() == st.RunnerDigest {
			say("runner image %s (%s)", tag, st.RunnerDigest)
			return nil
		}
	}
	cache, err := imagebuild.CacheRoot()
	if err != nil {
		return err
	}
	say("building the runner image %s: Debian bookworm with Python 3 (its root filesystem is built once and cached under %s; minutes the first time)", runnerImage, cache)
	img, err := imagebuild.Build(ctx, "runner", imagebuild.Options{CacheDir: cache, Created: time.Unix(0, 0).UTC(), Log: out})
	if err != nil {
		return fmt.Errorf("build the runner image (%s=0 skips it): %w", RunnerEnv, err)
	}
	pushed, err := imagebuild.Push(ctx, img, imagebuild.PushOptions{Registry: host, Revision: "local", Now: time.Now(), Log: out})
	if err != nil {
		return fmt.Errorf("push the runner image: %w", err)
	}
	st.RunnerRootfs, st.RunnerDigest = key, pushed.Digest
	say("runner image %s (%s)", tag, pushed.Digest)
	return st.save(p)
}
