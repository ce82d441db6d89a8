package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/errdefs"
)

// Pull returns the image ref names, downloading and unpacking it unless the
// cache has it. A digest reference that is cached needs no network; a tag is
// resolved against the registry each time unless Config.Offline, when the
// digest it resolved to last time is used. Concurrent pulls of one digest
// (in this process or others sharing Root) download and unpack it once.
// Pull blocks until the image is complete or ctx ends; the download itself
// continues for other waiters (bounded by Config.PullTimeout). The image is
// safe from GC for Config.GCGrace: Mount it within that time.
func (s *Store) Pull(ctx context.Context, ref string) (Image, error) {
	return s.PullWith(ctx, ref, nil)
}

// PullWith is Pull with kc, this pull's own credentials, asked before
// Config.Keychain. They serve this pull only: the store keeps no trace of
// them (not in its files, logs or errors). A tag is resolved with them on
// every pull, so a pull without them is refused by a registry that wants a
// login even when the image is cached.
func (s *Store) PullWith(ctx context.Context, ref string, kc Keychain) (Image, error) {
	img, cached, err := s.pull(ctx, ref, kc)
	switch {
	case err != nil:
		s.metrics.pulls.WithLabelValues("error").Inc()
		if !errdefs.IsCanceled(err) {
			s.log.Warn("image pull failed", "ref", ref, "err", err)
		}
	case cached:
		s.metrics.pulls.WithLabelValues("cached").Inc()
		s.metrics.cacheHits.Inc()
	default:
		s.metrics.pulls.WithLabelValues("fetched").Inc()
		s.log.Info("image pulled", "ref", img.Ref, "digest", img.Digest, "bytes", img.Size)
	}
	return img, err
}

func (s *Store) pull(ctx context.Context, ref string, kc Keychain) (Image, bool, error) {
	r, err := s.parseRef(ref)
	if err != nil {
		return Image{}, false, err
	}
	canonical := r.Name()
	if d, ok := r.(name.Digest); ok {
		// A cached image that needed a login is served only once the
		// registry accepted this pull's credentials (the manifest below).
		if img, ok := s.cached(d.DigestStr(), canonical); ok && !s.private(img.Digest) {
			return img, true, nil
		}
	}
	if s.cfg.Offline {
		// Offline, nothing can check a login: the cache serves what it has.
		if d, ok := r.(name.Digest); ok {
			if img, ok := s.cached(d.DigestStr(), canonical); ok {
				return img, true, nil
			}
		}
		if img, ok := s.cached("", canonical); ok {
			return img, true, nil
		}
		return Image{}, false, fmt.Errorf("pull %s: offline and not in the cache: %w", canonical, errdefs.ErrUnavailable)
	}

	c, err := s.newClient(ctx, r.Context(), kc)
	if err != nil {
		return Image{}, false, fmt.Errorf("pull %s: %w", canonical, err)
	}
	body, mt, digest, err := c.manifest(ctx, r.Identifier())
	if err != nil {
		s.forgetClient(r.Context())
		return Image{}, false, fmt.Errorf("pull %s: %w", canonical, err)
	}
	if mt.IsIndex() {
		child, err := s.choosePlatform(body)
		if err != nil {
			return Image{}, false, fmt.Errorf("pull %s: index %s: %w", canonical, digest, err)
		}
		if err := s.saveRef(r.Context().Digest(digest.String()).Name(), child.String()); err != nil {
			return Image{}, false, fmt.Errorf("pull %s: %w", canonical, err)
		}
		if img, ok := s.cached(child.String(), canonical); ok {
			return img, true, s.saveRef(canonical, img.Digest)
		}
		body, mt, digest, err = c.manifest(ctx, child.String())
		if err != nil {
			return Image{}, false, fmt.Errorf("pull %s: %w", canonical, err)
		}
		if !mt.IsImage() {
			return Image{}, false, fmt.Errorf("pull %s: platform manifest %s has media type %q: %w", canonical, digest, mt, errdefs.ErrInvalidArgument)
		}
	}
	if img, ok := s.cached(digest.String(), canonical); ok {
		return img, true, s.saveRef(canonical, img.Digest)
	}

	// A GC between the download and loading the record may take the
	// image again (with no grace under disk pressure): fetch once more.
	var img Image
	for try := 0; ; try++ {
		if err := s.fetch(ctx, c, digest, body); err != nil {
			return Image{}, false, fmt.Errorf("pull %s: %w", canonical, err)
		}
		if err := s.saveRef(canonical, digest.String()); err != nil {
			return Image{}, false, fmt.Errorf("pull %s: %w", canonical, err)
		}
		img, err = s.imageHeld(ctx, digest.Hex, canonical)
		if err == nil {
			break
		}
		if !errdefs.IsNotFound(err) || try == 2 {
			return Image{}, false, fmt.Errorf("pull %s: %w", canonical, err)
		}
	}
	if s.cfg.DiskBudget > 0 {
		if _, err := s.gc(ctx, digest.Hex); err != nil && !errdefs.IsCanceled(err) {
			s.log.Warn("image gc after pull", "err", err)
		}
	}
	return img, false, nil
}

// private reports whether the cached image digest needed a login.
func (s *Store) private(digest string) bool {
	hex, err := parseDigest(digest)
	if err != nil {
		return true
	}
	r, err := s.readRecord(hex)
	return err != nil || r.Private
}

// cached returns a complete image by digest, or else by what canonical
// resolved to before.
func (s *Store) cached(digest, canonical string) (Image, bool) {
	if digest == "" {
		d, ok := s.lookupRef(canonical)
		if !ok {
			return Image{}, false
		}
		digest = d
	}
	hex, err := parseDigest(digest)
	if err != nil {
		return Image{}, false
	}
	img, err := s.image(hex, canonical)
	if err != nil {
		// An index digest is not an image; it may map to one.
		if d, ok := s.lookupRef(canonical); ok && d != digest {
			return s.cached(d, canonical)
		}
		return Image{}, false
	}
	return img, true
}

func (s *Store) choosePlatform(body []byte) (v1.Hash, error) {
	idx, err := v1.ParseIndexManifest(bytes.NewReader(body))
	if err != nil {
		return v1.Hash{}, fmt.Errorf("parse: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	want := v1.Platform{OS: s.cfg.OS, Architecture: s.cfg.Architecture}
	for _, m := range idx.Manifests {
		if m.Platform != nil && m.Platform.Satisfies(want) && m.MediaType.IsImage() {
			return m.Digest, nil
		}
	}
	return v1.Hash{}, fmt.Errorf("no manifest for platform %s: %w", want.String(), errdefs.ErrNotFound)
}

// fetch runs one download of digest however many callers want it.
func (s *Store) fetch(ctx context.Context, c *registryClient, digest v1.Hash, body []byte) error {
	ch := s.sf.DoChan(digest.Hex, func() (any, error) {
		// Detached: other callers may be waiting on this download.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.PullTimeout)
		defer cancel()
		return nil, s.fetchAndUnpack(fctx, c, digest, body)
	})
	select {
	case <-ctx.Done():
		return ctx.Err()
	case res := <-ch:
		return res.Err
	}
}

// imageHeld loads an image under a shared hold of its lock, so a GC cannot
// take it half-way (it needs the lock exclusively), and marks it used.
func (s *Store) imageHeld(ctx context.Context, hex, ref string) (Image, error) {
	lock, err := lockPath(ctx, s.lockPath(hex), unix.LOCK_SH)
	if err != nil {
		return Image{}, err
	}
	defer lock.unlock()
	return s.image(hex, ref)
}

// fetchAndUnpack downloads every blob of the manifest and unpacks it into
// rootfs/<hex>, holding the digest's file lock so another process pulling
// the same digest waits and then finds it complete.
func (s *Store) fetchAndUnpack(ctx context.Context, c *registryClient, digest v1.Hash, body []byte) error {
	lock, err := lockPath(ctx, s.lockPath(digest.Hex), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer lock.unlock()
	if _, err := s.readRecord(digest.Hex); err == nil {
		return nil
	}

	m, err := v1.ParseManifest(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("manifest %s: parse: %w: %w", digest, errdefs.ErrInvalidArgument, err)
	}
	if err := s.checkManifest(digest, m); err != nil {
		return err
	}
	if fmt.Sprintf("%x", sha256.Sum256(body)) != digest.Hex {
		return fmt.Errorf("manifest %s: %w", digest, ErrDigestMismatch)
	}
	if _, err := os.Stat(s.blobPath(digest.Hex)); err != nil {
		if err := s.writeAtomic(s.blobPath(digest.Hex), body); err != nil {
			return fmt.Errorf("manifest %s: %w", digest, err)
		}
	}

	blobs := append([]v1.Descriptor{m.Config}, m.Layers...)
	defer s.claimBlobs(blobs)()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(3)
	for _, b := range blobs {
		g.Go(func() error {
			n, err := s.fetchBlob(gctx, c, b.Digest, b.Size)
			s.metrics.bytes.Add(float64(n))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	cfgBytes, err := os.ReadFile(s.blobPath(m.Config.Digest.Hex))
	if err != nil {
		return fmt.Errorf("config %s: %w", m.Config.Digest, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(cfgBytes))
	if err != nil {
		return fmt.Errorf("config %s: parse: %w: %w", m.Config.Digest, errdefs.ErrInvalidArgument, err)
	}
	if len(cf.RootFS.DiffIDs) != len(m.Layers) {
		return fmt.Errorf("config %s: %d diff_ids for %d layers: %w", m.Config.Digest, len(cf.RootFS.DiffIDs), len(m.Layers), errdefs.ErrInvalidArgument)
	}

	unpacked, err := s.unpack(ctx, digest.Hex, m.Layers, cf.RootFS.DiffIDs)
	if err != nil {
		return err
	}
	rec := record{
		Digest: digest.String(), Config: m.Config.Digest.String(), Private: c.authed,
		UnpackedBytes: unpacked, PulledAt: s.cfg.Clock.Now().UTC(),
		Blobs: []blobRecord{{Digest: digest.String(), Size: int64(len(body))}, {Digest: m.Config.Digest.String(), Size: m.Config.Size}},
	}
	for _, l := range m.Layers {
		rec.Layers = append(rec.Layers, l.Digest.String())
		rec.Blobs = append(rec.Blobs, blobRecord{Digest: l.Digest.String(), Size: l.Size})
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return s.writeAtomic(s.recordPath(digest.Hex), b)
}

// claimBlobs marks blobs as used by a pull in progress until the returned
// release is called.
func (s *Store) claimBlobs(blobs []v1.Descriptor) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range blobs {
		s.inflight[b.Digest.String()]++
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, b := range blobs {
			if s.inflight[b.Digest.String()]--; s.inflight[b.Digest.String()] <= 0 {
				delete(s.inflight, b.Digest.String())
			}
		}
	}
}

func (s *Store) checkManifest(digest v1.Hash, m *v1.Manifest) error {
	var errs []error
	if !m.Config.MediaType.IsConfig() {
		errs = append(errs, fmt.Errorf("config: unsupported media type %q", m.Config.MediaType))
	}
	for i, l := range m.Layers {
		if !slices.Contains(acceptedLayers, l.MediaType) {
			errs = append(errs, fmt.Errorf("layers[%d] %s: unsupported media type %q", i, l.Digest, l.MediaType))
		}
		if len(l.URLs) > 0 {
			errs = append(errs, fmt.Errorf("layers[%d] %s: foreign URLs are not fetched", i, l.Digest))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("manifest %s: %w: %w", digest, errdefs.ErrInvalidArgument, err)
	}
	return nil
}

// unpack applies the layers in order into a temp dir, re-verifying each
// blob's digest as it is read, and renames the result to rootfs/<hex>.
func (s *Store) unpack(ctx context.Context, hex string, layers []v1.Descriptor, diffIDs []v1.Hash) (int64, error) {
	tmp, err := os.MkdirTemp(s.path("tmp"), "rootfs-"+hex[:12]+"-")
	if err != nil {
		return 0, fmt.Errorf("image sha256:%s: unpack: %w", hex, err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return 0, fmt.Errorf("image sha256:%s: unpack: %w", hex, err)
	}
	root, err := unix.Open(tmp, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("image sha256:%s: unpack: %w", hex, err)
	}
	defer unix.Close(root)
	var total int64
	for i, l := range layers {
		n, err := s.applyBlob(ctx, tmp, root, l.Digest, diffIDs[i], s.cfg.MaxUnpackedSize-total)
		total += n
		if err != nil {
			return total, fmt.Errorf("image sha256:%s: %w", hex, err)
		}
	}
	if err := os.Rename(tmp, s.rootfsPath(hex)); err != nil {
		return total, fmt.Errorf("image sha256:%s: install rootfs: %w", hex, err)
	}
	return total, nil
}

// applyBlob applies one cached layer blob, checking both its digest and the
// config's diff_id (the sha256 of the uncompressed tar).
func (s *Store) applyBlob(ctx context.Context, tmp string, root int, d, diffID v1.Hash, limit int64) (int64, error) {
	f, err := os.Open(s.blobPath(d.Hex))
	if err != nil {
		return 0, fmt.Errorf("layer %s: %w", d, err)
	}
	defer f.Close()
	h, dh := sha256.New(), sha256.New()
	n, err := applyLayer(ctx, tmp, root, d.String(), io.TeeReader(f, h), s.cfg.AllowAbsoluteSymlinks, limit, dh)
	if err != nil {
		if errors.Is(err, ErrUnsafeLayer) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		return n, err
	}
	if _, err := io.Copy(h, f); err != nil {
		return n, fmt.Errorf("layer %s: %w", d, err)
	}
	if got := fmt.Sprintf("%x", h.Sum(nil)); got != d.Hex {
		return n, fmt.Errorf("layer %s: cached blob reads as sha256:%s: %w", d, got, ErrDigestMismatch)
	}
	if got := fmt.Sprintf("sha256:%x", dh.Sum(nil)); got != diffID.String() {
		return n, fmt.Errorf("layer %s: uncompressed content is %s, config diff_id says %s: %w", d, got, diffID, ErrDigestMismatch)
	}
	return n, nil
}

// blobHexes lists the hex of every blob in the cache.
func (s *Store) blobHexes() (map[string]int64, error) {
	ents, err := os.ReadDir(s.path("blobs", "sha256"))
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(ents))
	for _, e := range ents {
		if !hexRE.MatchString(e.Name()) {
			continue
		}
		fi, err := os.Lstat(filepath.Join(s.path("blobs", "sha256"), e.Name()))
		if err != nil {
			continue
		}
		out[e.Name()] = fi.Size()
	}
	return out, nil
}
