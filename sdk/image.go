package sdk

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/levers9/levers9/sandbox/image/recipe"
)

// ImageBuilder builds an image recipe step by step, the Go form of an
// image.yaml:
//
//	img := sdk.NewImage("debian:bookworm-slim").
//		Apt("curl").
//		Pip("numpy").
//		Env("APP_MODE", "prod").
//		Workdir("/app").
//		Copy("./src", "/app").
//		Run("python3 -m compileall /app").
//		Entrypoint("python3", "-m", "app")
//	r, err := img.Recipe()
//
// Each method appends one step (Env merges into a directly preceding env
// step) or sets a field and returns the builder; problems are collected and
// reported together by Recipe, which also validates. The builder only
// describes the image: building it is a separate call. It is not safe for
// concurrent use. (The type is not named Image: that name is the
// FunctionOption choosing a task's image.)
type ImageBuilder struct {
	r   recipe.Recipe
	err error
}

// NewImage starts a recipe from base: "debian:bookworm-slim", or
// "reg:5000/x/y@sha256:..."; a reference without a registry is resolved
// against the controlplane's imageService.runner.baseImageRegistry. An
// empty base is recipe.DefaultBase, the levers9-runner image.
func NewImage(base string) *ImageBuilder {
	return &ImageBuilder{r: recipe.Recipe{Base: cmp.Or(base, recipe.DefaultBase)}}
}

func (i *ImageBuilder) step(s recipe.Step) *ImageBuilder {
	i.r.Steps = append(i.r.Steps, s)
	return i
}

func (i *ImageBuilder) fail(format string, args ...any) *ImageBuilder {
	i.err = errors.Join(i.err, fmt.Errorf("sdk: image: "+format, args...))
	return i
}

// Run appends a step running cmd with /bin/sh -c.
func (i *ImageBuilder) Run(cmd string) *ImageBuilder { return i.step(recipe.Step{Run: cmd}) }

// Env sets one environment variable for later steps and the image. It
// appends an env step, or adds to the env step just before it, so
// Env("A", "1").Env("B", "2") is the YAML step env: {A: "1", B: "2"}.
// Names must be POSIX names and not LEVERS9_* (checked by Recipe).
func (i *ImageBuilder) Env(key, value string) *ImageBuilder {
	if n := len(i.r.Steps); n > 0 && len(i.r.Steps[n-1].Env) > 0 {
		i.r.Steps[n-1].Env[key] = value
		return i
	}
	return i.step(recipe.Step{Env: map[string]string{key: value}})
}

// Workdir appends a step setting the working directory (absolute) of later
// steps and of the image.
func (i *ImageBuilder) Workdir(dir string) *ImageBuilder { return i.step(recipe.Step{Workdir: dir}) }

// Copy appends a step copying the local file or directory src (relative to
// this process's working directory when the image is built) to the
// absolute path dst in the image. Its content, never its path, is part of
// the image's identity; it is uploaded by the build.
func (i *ImageBuilder) Copy(src, dst string) *ImageBuilder {
	return i.step(recipe.Step{Copy: &recipe.Copy{Src: src, Dst: dst}})
}

// Apt appends a step installing Debian packages (name[:arch][=version]).
func (i *ImageBuilder) Apt(pkgs ...string) *ImageBuilder {
	if len(pkgs) == 0 {
		return i.fail("Apt: no packages")
	}
	return i.step(recipe.Step{Apt: slices.Clone(pkgs)})
}

// Pip appends a step installing Python packages (name[==version]).
func (i *ImageBuilder) Pip(pkgs ...string) *ImageBuilder {
	if len(pkgs) == 0 {
		return i.fail("Pip: no packages")
	}
	return i.step(recipe.Step{Pip: slices.Clone(pkgs)})
}

// User sets the image's user: a name or uid[:gid].
func (i *ImageBuilder) User(u string) *ImageBuilder { i.r.User = u; return i }

// Entrypoint sets the image's entrypoint; with no arguments the base's is
// kept.
func (i *ImageBuilder) Entrypoint(args ...string) *ImageBuilder {
	i.r.Entrypoint = slices.Clone(args)
	return i
}

// Cmd sets the image's default arguments; with no arguments the base's are
// kept.
func (i *ImageBuilder) Cmd(args ...string) *ImageBuilder {
	i.r.Cmd = slices.Clone(args)
	return i
}

// Recipe returns a copy of the recipe built so far, validated: every
// problem, the builder's and Validate's, comes back at once.
func (i *ImageBuilder) Recipe() (*recipe.Recipe, error) {
	r := i.r.Clone()
	if len(r.Entrypoint) == 0 {
		r.Entrypoint = nil
	}
	if len(r.Cmd) == 0 {
		r.Cmd = nil
	}
	if err := errors.Join(i.err, r.Validate()); err != nil {
		return nil, err
	}
	return r, nil
}
