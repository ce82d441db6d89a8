package agent

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	gv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/agent/taskrun"
	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
	"github.com/levers9/levers9/sandbox/image/layer"
	"github.com/levers9/levers9/sandbox/image/recipe"
)

// buildImage runs an image build as one attempt: each rendered step of the
// recipe from spec.Start on, over the image so far. A run step is an
// attempt of its own in the Runner (the task's sandbox, security and
// egress; root inside), whose overlay upper directory becomes the step's
// layer; env and workdir steps change the config; a copy step's layer
// comes from its blob. Every step's image is pushed as step-<key hex>, so
// a later build that shares the first steps starts after them, and the
// result as <hash hex>. Output goes to the attempt's log, step markers
// included.
func buildImage(ctx context.Context, runner *taskrun.Runner, task taskrun.Task, spec *agentv1.BuildSpec, out taskrun.Output) (taskrun.Result, error) {
	b := &imageBuild{runner: runner, task: task, spec: spec, out: out}
	res, err := b.run(ctx)
	if err != nil && res.State == "" {
		b.say(taskrun.Stderr, "build failed: %v", err)
		res = taskrun.Result{State: taskrun.StateFailed, Exit: sandbox.ExitStatus{Code: 1}, Summary: "the image build failed: " + err.Error()}
	}
	return res, nil
}

type imageBuild struct {
	runner *taskrun.Runner
	task   taskrun.Task
	spec   *agentv1.BuildSpec
	out    taskrun.Output
	opts   []remote.Option
	repo   name.Repository
}

func (b *imageBuild) say(stream taskrun.Stream, format string, a ...any) {
	if b.out.Logs == nil {
		return
	}
	_ = b.out.Logs.Line(context.Background(), taskrun.LogLine{Stream: stream, Time: time.Now(), Text: fmt.Sprintf(format, a...)})
}

func (b *imageBuild) run(ctx context.Context) (taskrun.Result, error) {
	r, err := recipe.Parse(b.spec.GetRecipe())
	if err != nil {
		return taskrun.Result{}, fmt.Errorf("recipe: %w", err)
	}
	steps := r.Rendered()
	keys, err := recipe.StepKeys(r, b.spec.GetBaseDigest())
	if err != nil {
		return taskrun.Result{}, fmt.Errorf("recipe: %w", err)
	}
	if b.repo, err = name.NewRepository(b.spec.GetRepository()); err != nil {
		return taskrun.Result{}, fmt.Errorf("build repository: %w", err)
	}
	auth := authn.Anonymous
	if a := b.spec.GetPushAuth(); a != nil && a.GetUsername() != "" {
		auth = authn.FromConfig(authn.AuthConfig{Username: a.GetUsername(), Password: a.GetPassword()})
	}
	b.opts = []remote.Option{remote.WithContext(ctx), remote.WithAuth(auth), remote.WithTransport(b.runner.Images().Transport())}
	parent, err := name.ParseReference(b.spec.GetParent())
	if err != nil {
		return taskrun.Result{}, fmt.Errorf("build parent %q: %w", b.spec.GetParent(), err)
	}
	cur, err := remote.Image(parent, b.opts...)
	if err != nil {
		return taskrun.Result{}, fmt.Errorf("read the build's parent image %s: %w", parent, err)
	}
	start := int(b.spec.GetStart())
	if start > 0 {
		b.say(taskrun.Stdout, "steps 1-%d of %d: cached", start, len(steps))
	}
	b.out.Events(taskrun.Event{Kind: taskrun.EventState, To: taskrun.StateRunning, Time: time.Now()})
	dir, err := os.MkdirTemp("", "levers9-build-")
	if err != nil {
		return taskrun.Result{}, fmt.Errorf("build scratch directory: %w", err)
	}
	defer os.RemoveAll(dir)
	for i := start; i < len(steps); i++ {
		st := steps[i]
		b.say(taskrun.Stdout, "step %d/%d: %s", i+1, len(steps), describeStep(st))
		var add layer.AppendStep
		switch {
		case st.Run != "":
			l, res, err := b.runStep(ctx, cur, i, st.Run, filepath.Join(dir, fmt.Sprintf("step%d.tar", i)))
			if err != nil || res.State != taskrun.StateSucceeded {
				if err == nil {
					msg := fmt.Sprintf("step %d/%d (run %s) failed with exit code %d", i+1, len(steps), shorten(st.Run), res.Exit.Code)
					if res.Summary != "" {
						msg += ": " + res.Summary
					}
					b.say(taskrun.Stderr, "%s", msg)
					res.Summary = msg
				}
				return res, err
			}
			add = layer.AppendStep{Layer: l, CreatedBy: "RUN /bin/sh -c " + st.Run}
		case st.Copy != nil:
			ref, err := b.imageSoFar(cur, i)
			if err != nil {
				return taskrun.Result{}, err
			}
			l, err := b.copyLayer(ctx, ref, st.Copy, filepath.Join(dir, fmt.Sprintf("step%d.tar", i)))
			if err != nil {
				return taskrun.Result{}, fmt.Errorf("step %d/%d (copy to %s): %w", i+1, len(steps), st.Copy.Dst, err)
			}
			add = layer.AppendStep{Layer: l, CreatedBy: "COPY " + st.Copy.Blob + " " + st.Copy.Dst}
		case len(st.Env) > 0:
			add = layer.AppendStep{Config: layer.ConfigChange{Env: st.Env}, CreatedBy: "ENV"}
		case st.Workdir != "":
			add = layer.AppendStep{Config: layer.ConfigChange{Workdir: st.Workdir}, CreatedBy: "WORKDIR " + st.Workdir}
		default:
			return taskrun.Result{}, fmt.Errorf("step %d/%d: nothing to do", i+1, len(steps))
		}
		if cur, err = layer.Append(cur, []layer.AppendStep{add}); err != nil {
			return taskrun.Result{}, fmt.Errorf("step %d/%d: %w", i+1, len(steps), err)
		}
		if err := remote.Write(b.repo.Tag(recipe.StepTag(keys[i])), cur, b.opts...); err != nil {
			return taskrun.Result{}, fmt.Errorf("step %d/%d: push to %s: %w", i+1, len(steps), b.repo, err)
		}
	}
	final := layer.ConfigChange{User: r.User, Entrypoint: r.Entrypoint, SetEntrypoint: len(r.Entrypoint) > 0, Cmd: r.Cmd, SetCmd: len(r.Cmd) > 0}
	if cur, err = layer.Append(cur, []layer.AppendStep{{Config: final, CreatedBy: "CONFIG"}}); err != nil {
		return taskrun.Result{}, fmt.Errorf("image config: %w", err)
	}
	if err := remote.Write(b.repo.Tag(recipe.ImageTag(b.spec.GetHash())), cur, b.opts...); err != nil {
		return taskrun.Result{}, fmt.Errorf("push the image to %s: %w", b.repo, err)
	}
	d, err := cur.Digest()
	if err != nil {
		return taskrun.Result{}, err
	}
	b.say(taskrun.Stdout, "image %s@%s", b.repo, d)
	return taskrun.Result{State: taskrun.StateSucceeded, ImageDigest: d.String()}, nil
}

// runStep runs one run step in the Runner over cur and returns its layer.
func (b *imageBuild) runStep(ctx context.Context, cur gv1.Image, i int, cmd, tarPath string) (gv1.Layer, taskrun.Result, error) {
	t := b.task
	t.ID = fmt.Sprintf("%s-s%d", b.task.ID, i)
	// The Runner pulls the image so far: the parent where the build
	// starts, else the image the previous step pushed (under its step tag,
	// so by digest too).
	var err error
	if t.Image, err = b.imageSoFar(cur, i); err != nil {
		return nil, taskrun.Result{}, err
	}
	t.Args, t.User, t.Cwd = []string{"/bin/sh", "-c", cmd}, "0", ""
	t.Volumes, t.SecretEnv, t.Env = nil, nil, nil
	t.RegistryAuth = b.keychain()
	var mu sync.Mutex
	captured := false
	var capErr error
	t.Build = &taskrun.BuildStep{Capture: func(_ context.Context, upper string) error {
		f, err := os.OpenFile(tarPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err == nil {
			// The step's own context, not the hook's cleanup bound: a
			// big step's tar takes as long as it takes.
			err = layer.FromUpper(ctx, upper, f, layer.Options{Exclude: layer.SandboxExcludes})
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		mu.Lock()
		defer mu.Unlock()
		captured, capErr = true, err
		return err
	}}
	out := b.out
	out.Events = func(e taskrun.Event) {
		// The build's attempt is RUNNING once; the steps' own states are
		// theirs.
		if e.Kind == taskrun.EventState {
			return
		}
		b.out.Events(e)
	}
	res, err := b.runner.Run(ctx, t, out)
	if err != nil || res.State != taskrun.StateSucceeded {
		return nil, res, err
	}
	mu.Lock()
	defer mu.Unlock()
	if !captured || capErr != nil {
		return nil, taskrun.Result{}, fmt.Errorf("step %d: its changes could not be captured: %v", i+1, capErr)
	}
	l, err := layer.Layer(tarPath)
	return l, res, err
}

// imageSoFar is the reference of cur, the image step i starts from: the
// parent where the build starts, else the image the previous step pushed
// (under its step tag, so by digest too).
func (b *imageBuild) imageSoFar(cur gv1.Image, i int) (string, error) {
	if i == int(b.spec.GetStart()) {
		return b.spec.GetParent(), nil
	}
	d, err := cur.Digest()
	if err != nil {
		return "", err
	}
	return b.repo.Digest(d.String()).String(), nil
}

// keychain holds the build's push credentials, which read its images too
// (nil: anonymous).
func (b *imageBuild) keychain() image.StaticKeychain {
	if a := b.spec.GetPushAuth(); a != nil && a.GetUsername() != "" {
		return image.StaticKeychain{a.GetHost(): {Username: a.GetUsername(), Password: a.GetPassword()}}
	}
	return nil
}

// copyLayer makes a copy step's layer from its blob. The directories it
// creates on the way to the destination take their mode and owner from the
// image so far (ref), which the node's image store pulls for that.
func (b *imageBuild) copyLayer(ctx context.Context, ref string, c *recipe.Copy, tarPath string) (gv1.Layer, error) {
	img, err := b.runner.Images().PullWith(ctx, ref, b.keychain())
	if err != nil {
		return nil, fmt.Errorf("pull the image so far: %w", err)
	}
	blobs, err := name.NewRepository(b.spec.GetBlobRepository())
	if err != nil {
		return nil, fmt.Errorf("blob repository: %w", err)
	}
	bl, err := remote.Layer(blobs.Digest(c.Blob), b.opts...)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", c.Blob, err)
	}
	rc, err := bl.Compressed()
	if err != nil {
		return nil, fmt.Errorf("read blob %s: %w", c.Blob, err)
	}
	defer rc.Close()
	f, err := os.OpenFile(tarPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	err = layer.FromCopy(ctx, rc, c.Dst, f, layer.Options{Lookup: func(p string) (*tar.Header, error) { return lookupInRoot(img.RootFS, p) }})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", c.Blob, err)
	}
	return layer.Layer(tarPath)
}

func describeStep(st recipe.Step) string {
	switch {
	case st.Run != "":
		return "run " + shorten(st.Run)
	case st.Copy != nil:
		return "copy " + st.Copy.Src + " to " + st.Copy.Dst
	case len(st.Env) > 0:
		return "env " + strings.Join(slices.Sorted(maps.Keys(st.Env)), " ")
	case st.Workdir != "":
		return "workdir " + st.Workdir
	}
	return "?"
}

func shorten(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		return s[:117] + "..."
	}
	return s
}

// lookupInRoot describes the entry at p in an image's unpacked root
// without following a final symlink (earlier ones resolve inside the
// root): a directory's or file's mode and owner, a symlink's target; nil
// when there is none.
func lookupInRoot(root, p string) (*tar.Header, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open image root: %w", err)
	}
	defer unix.Close(rfd)
	rel := strings.TrimPrefix(path.Clean(p), "/")
	fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	h := &tar.Header{Name: rel, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid), Typeflag: tar.TypeReg}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag = tar.TypeDir
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return nil, err
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, string(buf[:n])
	}
	return h, nil
}
