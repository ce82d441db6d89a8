package image

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/levers9/levers9/internal/clock"
)

// Config configures a Store. Zero values get the defaults of withDefaults.
type Config struct {
	// Root is the cache directory (required, absolute).
	Root string
	// Registry is worker.imageRegistry: the registry host[:port] references
	// without a registry resolve against, and the only one contacted unless
	// listed in Registries.
	Registry string
	// Registries lists further registries a reference may name explicitly.
	Registries []string
	// InsecureRegistries may be reached over plain HTTP (e.g. a local
	// 127.0.0.1:PORT registry). Every other registry is HTTPS only, even a
	// loopback or RFC 1918 one that go-containerregistry would otherwise
	// downgrade.
	InsecureRegistries []string
	// Keychain supplies credentials; nil means anonymous.
	Keychain Keychain
	// DiskBudget caps blobs plus unpacked images in bytes; least recently
	// used images above it are evicted after each pull. 0 disables GC.
	DiskBudget int64
	// GCGrace protects images used more recently than this from eviction,
	// so an image between Pull and Mount is not collected (default 5m).
	GCGrace time.Duration
	// Offline forbids network access: only cached digests and tags already
	// resolved by an earlier pull are served.
	Offline bool
	// AllowAbsoluteSymlinks accepts absolute symlink targets (common in
	// distribution images such as Debian's /etc/alternatives). They resolve
	// inside the container's root at run time, but host code must then never
	// follow links in a lower directory. Default: refused.
	AllowAbsoluteSymlinks bool
	// OS and Architecture choose from a multi-platform index (default
	// linux/runtime.GOARCH).
	OS, Architecture string
	// Transport is the base HTTP transport (default: a clone of
	// http.DefaultTransport).
	Transport http.RoundTripper
	// MountSource names the overlay mounts in /proc/self/mountinfo so a
	// reconcile can recognise them (default "levers9").
	MountSource string
	// PullTimeout bounds one download+unpack, which continues when the
	// caller that started it gives up, so waiting callers still get it
	// (default 30m).
	PullTimeout time.Duration
	// MaxBlobSize refuses a manifest declaring a larger blob (default 32 GiB).
	MaxBlobSize int64
	// MaxUnpackedSize refuses an image whose files add up to more, so a
	// decompression bomb cannot fill the disk (default 64 GiB).
	MaxUnpackedSize int64

	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Clock stamps last-use and pull times (default the wall clock).
	Clock clock.Clock
}

var mountSourceRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

func (c Config) withDefaults() Config {
	if c.OS == "" {
		c.OS = "linux"
	}
	if c.Architecture == "" {
		c.Architecture = runtime.GOARCH
	}
	if c.Transport == nil {
		c.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	if c.MountSource == "" {
		c.MountSource = "levers9"
	}
	if c.PullTimeout == 0 {
		c.PullTimeout = 30 * time.Minute
	}
	if c.MaxBlobSize == 0 {
		c.MaxBlobSize = 32 << 30
	}
	if c.GCGrace == 0 {
		c.GCGrace = 5 * time.Minute
	}
	if c.MaxUnpackedSize == 0 {
		c.MaxUnpackedSize = 64 << 30
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Clock = clock.OrReal(c.Clock)
	return c
}

// Validate reports every problem at once, each naming its field.
func (c Config) Validate() error {
	var errs []error
	if c.Root == "" || !filepath.IsAbs(c.Root) {
		errs = append(errs, fmt.Errorf("image.Root: %q must be an absolute path", c.Root))
	}
	if c.Registry == "" {
		errs = append(errs, errors.New("image.Registry: required (worker.imageRegistry)"))
	}
	check := func(field, r string) {
		if _, err := name.NewRegistry(r, name.StrictValidation); err != nil {
			errs = append(errs, fmt.Errorf("%s: %q: %w", field, r, err))
		}
	}
	if c.Registry != "" {
		check("image.Registry", c.Registry)
	}
	for i, r := range c.Registries {
		check(fmt.Sprintf("image.Registries[%d]", i), r)
	}
	for i, r := range c.InsecureRegistries {
		check(fmt.Sprintf("image.InsecureRegistries[%d]", i), r)
		if r != c.Registry && !slices.Contains(c.Registries, r) {
			errs = append(errs, fmt.Errorf("image.InsecureRegistries[%d]: %q is neither Registry nor in Registries", i, r))
		}
	}
	if c.DiskBudget < 0 {
		errs = append(errs, fmt.Errorf("image.DiskBudget: %d must not be negative", c.DiskBudget))
	}
	if c.GCGrace < 0 {
		errs = append(errs, fmt.Errorf("image.GCGrace: %v must not be negative", c.GCGrace))
	}
	if c.MountSource != "" && !mountSourceRE.MatchString(c.MountSource) {
		errs = append(errs, fmt.Errorf("image.MountSource: %q must match %s", c.MountSource, mountSourceRE))
	}
	if c.PullTimeout < 0 {
		errs = append(errs, fmt.Errorf("image.PullTimeout: %v must not be negative", c.PullTimeout))
	}
	if c.MaxBlobSize < 0 {
		errs = append(errs, fmt.Errorf("image.MaxBlobSize: %d must not be negative", c.MaxBlobSize))
	}
	if c.MaxUnpackedSize < 0 {
		errs = append(errs, fmt.Errorf("image.MaxUnpackedSize: %d must not be negative", c.MaxUnpackedSize))
	}
	return errors.Join(errs...)
}
