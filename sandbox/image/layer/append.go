package layer

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/levers9/levers9/internal/errdefs"
)

// ConfigChange is what one step changes in the image config. Zero fields
// change nothing.
type ConfigChange struct {
	// Env sets variables: a key already in the config keeps its place and
	// takes the new value; new keys are appended in sorted order.
	Env map[string]string
	// Workdir sets the working directory; a relative one is resolved
	// against the previous working directory ("/" when unset).
	Workdir string
	// User sets the user ("name", "uid", "uid:gid").
	User string
	// Entrypoint and Cmd replace the config's when SetEntrypoint or SetCmd
	// is true (nil clears). As in a Dockerfile, setting the entrypoint
	// without setting the command in the same step clears the command.
	Entrypoint, Cmd       []string
	SetEntrypoint, SetCmd bool
}

// AppendStep is one build step's contribution to an image.
type AppendStep struct {
	// Layer is the step's layer; nil for a step that changes only the
	// config.
	Layer v1.Layer
	// Config is applied after the layer.
	Config ConfigChange
	// CreatedBy is the history entry's text (e.g. the step as the recipe
	// wrote it).
	CreatedBy string
}

// Append returns parent with steps applied in order: their layers appended
// (with the OCI layer media type on an OCI parent, Docker's otherwise),
// their config changes applied, one history entry each (Created the Unix
// epoch, CreatedBy as given, EmptyLayer for config-only steps) and the
// config's Created set to the Unix epoch, so the result's digest depends
// only on parent and steps. Invalid steps are reported all at once, each
// naming its index.
func Append(parent v1.Image, steps []AppendStep) (v1.Image, error) {
	return AppendAt(parent, time.Time{}, steps)
}

// AppendAt is Append with the history and config times set to epoch
// (SOURCE_DATE_EPOCH, truncated to seconds; the zero value means Unix 0).
func AppendAt(parent v1.Image, epoch time.Time, steps []AppendStep) (v1.Image, error) {
	if err := validateSteps(steps); err != nil {
		return nil, fmt.Errorf("append to image: %w", err)
	}
	epoch = normEpoch(epoch)
	pcf, err := parent.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("append to image: parent config: %w", err)
	}
	mt, err := parent.MediaType()
	if err != nil {
		return nil, fmt.Errorf("append to image: parent media type: %w", err)
	}
	oci := mt == types.OCIManifestSchema1
	var adds []mutate.Addendum
	for i, s := range steps {
		if s.Layer == nil {
			continue
		}
		lmt, err := s.Layer.MediaType()
		if err != nil {
			return nil, fmt.Errorf("append to image: step %d: layer media type: %w", i, err)
		}
		a := mutate.Addendum{Layer: s.Layer}
		switch {
		case oci && lmt == types.DockerLayer:
			a.MediaType = types.OCILayer
		case !oci && lmt == types.OCILayer:
			a.MediaType = types.DockerLayer
		}
		adds = append(adds, a)
	}
	img := parent
	if len(adds) > 0 {
		if img, err = mutate.Append(parent, adds...); err != nil {
			return nil, fmt.Errorf("append to image: %w", err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("append to image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.History = slices.Clone(pcf.History)
	for _, s := range steps {
		cf.History = append(cf.History, v1.History{Created: v1.Time{Time: epoch}, CreatedBy: s.CreatedBy, EmptyLayer: s.Layer == nil})
		applyChange(&cf.Config, s.Config)
	}
	cf.Created = v1.Time{Time: epoch}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("append to image: %w", err)
	}
	return img, nil
}

func validateSteps(steps []AppendStep) error {
	var bad []string
	for i, s := range steps {
		keys := make([]string, 0, len(s.Config.Env))
		for k := range s.Config.Env {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				bad = append(bad, fmt.Sprintf("steps[%d].config.env[%q]: a name must be non-empty without '=' or NUL", i, k))
			} else if strings.IndexByte(s.Config.Env[k], 0) >= 0 {
				bad = append(bad, fmt.Sprintf("steps[%d].config.env[%q]: NUL in value", i, k))
			}
		}
		if strings.IndexByte(s.Config.Workdir, 0) >= 0 {
			bad = append(bad, fmt.Sprintf("steps[%d].config.workdir: NUL byte", i))
		}
		if strings.IndexByte(s.Config.User, 0) >= 0 {
			bad = append(bad, fmt.Sprintf("steps[%d].config.user: NUL byte", i))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s: %w", strings.Join(bad, "; "), errdefs.ErrInvalidArgument)
	}
	return nil
}

func applyChange(c *v1.Config, ch ConfigChange) {
	if len(ch.Env) > 0 {
		keys := make([]string, 0, len(ch.Env))
		for k := range ch.Env {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		env := slices.Clone(c.Env)
		for _, k := range keys {
			kv := k + "=" + ch.Env[k]
			i := slices.IndexFunc(env, func(e string) bool { return e == k || strings.HasPrefix(e, k+"=") })
			if i >= 0 {
				env[i] = kv
			} else {
				env = append(env, kv)
			}
		}
		c.Env = env
	}
	if ch.Workdir != "" {
		wd := ch.Workdir
		if !path.IsAbs(wd) {
			prev := c.WorkingDir
			if prev == "" {
				prev = "/"
			}
			wd = path.Join(prev, wd)
		}
		c.WorkingDir = path.Clean(wd)
	}
	if ch.User != "" {
		c.User = ch.User
	}
	if ch.SetEntrypoint {
		c.Entrypoint = slices.Clone(ch.Entrypoint)
		if !ch.SetCmd {
			c.Cmd = nil
		}
	}
	if ch.SetCmd {
		c.Cmd = slices.Clone(ch.Cmd)
	}
}
