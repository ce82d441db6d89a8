package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sync/singleflight"

	"github.com/levers9/levers9/internal/errdefs"
)

// ErrDigestMismatch marks a blob whose bytes do not hash to the digest that
// named it (a corrupt or malicious registry or proxy). Nothing is stored.
var ErrDigestMismatch = errors.New("digest mismatch")

// Image is a complete, unpacked image in the cache.
type Image struct {
	// Digest is the image manifest's digest ("sha256:<hex>"); for a
	// multi-platform reference, the digest of the chosen platform's manifest.
	Digest string
	// Ref is the canonical reference that was pulled (empty from Get).
	Ref    string
	Config ImageConfig
	// Layers are the layer digests, bottom first.
	Layers []string
	// Size is the bytes of the image's blobs plus its unpacked tree.
	Size int64
	// RootFS is the read-only lower directory. Never write into it and never
	// follow symlinks in it from host code; give tasks a Mount instead.
	RootFS string
}

// ImageConfig is what the spec builder needs from the image's config.
type ImageConfig struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	WorkingDir string
	StopSignal string
	Labels     map[string]string
}

// Store is the node's image cache. All methods are safe for concurrent use.
// Several Stores (in one or several processes) may share one Root: pulls of
// one digest are serialised by a file lock and mounts are seen through
// mountinfo. One limit across processes: GC in one process does not know
// which shared blobs another process's pull in progress found present, so
// that pull can fail (and succeeds when retried); within a process it cannot.
//
// Lifecycle of an image:
//
//	(absent) --Pull--> complete --Mount--> mounted --cleanup--> complete
//	                      |                                        |
//	                      +---------GC (unused for GCGrace)--------+--> (absent)
type Store struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	sf      singleflight.Group

	// mu guards mounts and inflight, and serialises GC's checks with
	// Mount's pin and a pull's claim on its blobs.
	mu sync.Mutex
	// mounts counts this process's live task mounts per image hex.
	mounts map[string]int
	// inflight counts pulls in progress per blob digest, so GC does not
	// delete a shared blob a pull found present but has not unpacked yet.
	inflight map[string]int

	// clientsMu guards clients: anonymous registry clients by repository
	// (registry.go).
	clientsMu sync.Mutex
	clients   map[string]keptClient
}

// New validates cfg and creates the cache directories.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("image store config: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("image store metrics: %w", err)
	}
	s := &Store{cfg: cfg, log: cfg.Logger.With("component", "image"), metrics: m, mounts: map[string]int{}, inflight: map[string]int{}, clients: map[string]keptClient{}}
	// Unpacked trees hold images' setuid binaries and device-free but
	// otherwise arbitrary files: only root may traverse to them, so a local
	// host user can never run an image's setuid-root binary.
	dirs := []struct {
		path string
		mode os.FileMode
	}{
		{"blobs/sha256", 0o755}, {"images", 0o755}, {"refs", 0o755}, {"locks", 0o755},
		{"rootfs", 0o700}, {"tasks", 0o700}, {"tmp", 0o700},
	}
	for _, d := range dirs {
		if err := os.MkdirAll(s.path(d.path), d.mode); err != nil {
			return nil, fmt.Errorf("image store: create %s: %w", s.path(d.path), err)
		}
		if err := os.Chmod(s.path(d.path), d.mode); err != nil {
			return nil, fmt.Errorf("image store: chmod %s: %w", s.path(d.path), err)
		}
	}
	return s, nil
}

func (s *Store) path(parts ...string) string {
	return filepath.Join(append([]string{s.cfg.Root}, parts...)...)
}

func (s *Store) blobPath(hex string) string   { return s.path("blobs", "sha256", hex) }
func (s *Store) rootfsPath(hex string) string { return s.path("rootfs", hex) }
func (s *Store) recordPath(hex string) string { return s.path("images", hex+".json") }
func (s *Store) lockPath(hex string) string   { return s.path("locks", hex+".lock") }

var hexRE = regexp.MustCompile(`^[a-f0-9]{64}$`)

// parseDigest accepts "sha256:<64 hex>" and returns the hex.
func parseDigest(d string) (string, error) {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || !hexRE.MatchString(h) {
		return "", fmt.Errorf("digest %q: want sha256:<64 lowercase hex>: %w", d, errdefs.ErrInvalidArgument)
	}
	return h, nil
}

// record is images/<hex>.json; its presence (after rootfs/<hex>) marks the
// image complete. Its mtime is the image's last use.
type record struct {
	Digest        string       `json:"digest"`
	Config        string       `json:"config"`
	Layers        []string     `json:"layers"`
	Blobs         []blobRecord `json:"blobs"`
	UnpackedBytes int64        `json:"unpackedBytes"`
	PulledAt      time.Time    `json:"pulledAt"`
	// Private is true when the download needed a login (never the login
	// itself): a digest reference to it is then checked with the registry,
	// with the pull's own credentials, before the cache serves it.
	Private bool `json:"private,omitempty"`
}

type blobRecord struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

func (r record) size() int64 {
	n := r.UnpackedBytes
	for _, b := range r.Blobs {
		n += b.Size
	}
	return n
}

// readRecord returns the record of a complete image, or ErrNotFound.
func (s *Store) readRecord(hex string) (record, error) {
	var r record
	b, err := os.ReadFile(s.recordPath(hex))
	if errors.Is(err, os.ErrNotExist) {
		return r, fmt.Errorf("image sha256:%s: %w", hex, errdefs.ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("read image record sha256:%s: %w", hex, err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("parse image record sha256:%s: %w", hex, err)
	}
	if _, err := os.Lstat(s.rootfsPath(hex)); err != nil {
		return r, fmt.Errorf("image sha256:%s: rootfs missing: %w", hex, errdefs.ErrNotFound)
	}
	return r, nil
}

// image loads a complete image and marks it used now.
func (s *Store) image(hex, ref string) (Image, error) {
	r, err := s.readRecord(hex)
	if err != nil {
		return Image{}, err
	}
	cfgHex, err := parseDigest(r.Config)
	if err != nil {
		return Image{}, fmt.Errorf("image sha256:%s: record: %w", hex, err)
	}
	b, err := os.ReadFile(s.blobPath(cfgHex))
	if err != nil {
		return Image{}, fmt.Errorf("image sha256:%s: read config blob: %w", hex, err)
	}
	cf, err := v1.ParseConfigFile(strings.NewReader(string(b)))
	if err != nil {
		return Image{}, fmt.Errorf("image sha256:%s: parse config: %w", hex, err)
	}
	s.touch(hex)
	c := cf.Config
	return Image{
		Digest: r.Digest,
		Ref:    ref,
		Config: ImageConfig{
			Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, User: c.User,
			WorkingDir: c.WorkingDir, StopSignal: c.StopSignal, Labels: c.Labels,
		},
		Layers: r.Layers,
		Size:   r.size(),
		RootFS: s.rootfsPath(hex),
	}, nil
}

func (s *Store) touch(hex string) {
	now := s.cfg.Clock.Now()
	if err := os.Chtimes(s.recordPath(hex), now, now); err != nil {
		s.log.Warn("mark image used", "digest", "sha256:"+hex, "err", err)
	}
}

// Get returns a cached image by digest without any network access, or an
// ErrNotFound error. It marks the image used.
func (s *Store) Get(ctx context.Context, digest string) (Image, error) {
	if err := ctx.Err(); err != nil {
		return Image{}, err
	}
	hex, err := parseDigest(digest)
	if err != nil {
		return Image{}, err
	}
	return s.image(hex, "")
}

// refEntry is refs/<sha256 of the reference>.json: a tag or an index digest
// resolved to the image digest, so an offline pull can use it.
type refEntry struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

func (s *Store) refPath(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return s.path("refs", hex.EncodeToString(sum[:])+".json")
}

func (s *Store) saveRef(ref, digest string) error {
	if d, ok := s.lookupRef(ref); ok && d == digest {
		// Every start of a cached tag resolves it again: most find it
		// where it was, and a read is cheaper than a write and rename.
		return nil
	}
	b, err := json.Marshal(refEntry{Ref: ref, Digest: digest})
	if err != nil {
		return err
	}
	return s.writeAtomic(s.refPath(ref), b)
}

// lookupRef returns the image digest a reference resolved to last time.
func (s *Store) lookupRef(ref string) (string, bool) {
	b, err := os.ReadFile(s.refPath(ref))
	if err != nil {
		return "", false
	}
	var e refEntry
	if json.Unmarshal(b, &e) != nil || e.Ref != ref {
		return "", false
	}
	return e.Digest, true
}

// writeAtomic writes data to path via a temp file and rename, mode 0644.
func (s *Store) writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(s.path("tmp"), "write-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
