package config

import (
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// ImageService holds where the images the platform itself builds come from
// and go to (imageService.*).
type ImageService struct {
	Runner Runner `yaml:"runner"`
}

// Runner configures the runner images task image recipes start from.
type Runner struct {
	// BaseImageRegistry is where runner base images (levers9-runner and
	// the images recipes build on) are pulled from: a registry host[:port],
	// optionally followed by a path prefix (registry.example.com/levers9).
	// Empty means not configured; the Helm chart requires it. Env:
	// LEVERS9_IMAGESERVICE_RUNNER_BASEIMAGEREGISTRY.
	BaseImageRegistry string `yaml:"baseImageRegistry"`
}

// validateRegistry checks a registry value: a host[:port] that names a
// registry explicitly (go-containerregistry's strict rules, as the agent's
// image cache checks worker.imageRegistry), and, when prefixOK, an
// optional repository path after it. Empty values are left to the caller.
func validateRegistry(bad func(string, string, ...any), key, v string, prefixOK bool) {
	if v == "" {
		return
	}
	host, path, hasPath := strings.Cut(v, "/")
	if _, err := name.NewRegistry(host, name.StrictValidation); err != nil || strings.TrimSpace(v) != v ||
		strings.HasSuffix(host, ":") || strings.Contains(v, "://") {
		bad(key, "%q is not a registry host[:port] (like registry.example.com or 10.0.0.5:5000)", v)
		return
	}
	if !hasPath {
		return
	}
	if !prefixOK {
		bad(key, "%q: give the registry host[:port] only, without a path", v)
		return
	}
	// A repository under the prefix must parse, and must stay on this
	// registry (a first component without '.' or ':' would otherwise be
	// read as a Docker Hub namespace).
	r, err := name.NewRepository(v+"/levers9-runner", name.StrictValidation)
	if err != nil || path == "" || r.RegistryStr() != host {
		bad(key, "%q is not a registry host[:port] with a path prefix (like registry.example.com/levers9)", v)
	}
}

func (s ImageService) validate(bad func(string, string, ...any)) {
	validateRegistry(bad, "imageService.runner.baseImageRegistry", s.Runner.BaseImageRegistry, true)
}
