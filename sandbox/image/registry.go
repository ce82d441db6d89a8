package image

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/levers9/levers9/internal/errdefs"
)

// maxManifestSize bounds a manifest or index read into memory.
const maxManifestSize = 4 << 20

var acceptedManifests = []types.MediaType{
	types.OCIManifestSchema1, types.DockerManifestSchema2,
	types.OCIImageIndex, types.DockerManifestList,
}

var acceptedLayers = []types.MediaType{
	types.OCILayer, types.OCILayerZStd, types.OCIUncompressedLayer,
	types.DockerLayer, types.DockerUncompressedLayer,
}

// parseRef resolves ref against the configured registry and refuses one
// that names a registry not configured.
func (s *Store) parseRef(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref, name.WithDefaultRegistry(s.cfg.Registry))
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %w: %w", ref, errdefs.ErrInvalidArgument, err)
	}
	reg := r.Context().RegistryStr()
	if reg != s.cfg.Registry && !slices.Contains(s.cfg.Registries, reg) {
		return nil, fmt.Errorf("image reference %q: registry %s is not configured (worker.imageRegistry is %s): %w",
			ref, reg, s.cfg.Registry, errdefs.ErrPermissionDenied)
	}
	if slices.Contains(s.cfg.InsecureRegistries, reg) {
		r, err = name.ParseReference(ref, name.WithDefaultRegistry(s.cfg.Registry), name.Insecure)
		if err != nil {
			return nil, fmt.Errorf("image reference %q: %w: %w", ref, errdefs.ErrInvalidArgument, err)
		}
	}
	return r, nil
}

// ErrAccessRefused marks a pull the registry answered with 401 or 403: it
// wants a login this pull did not have, or refuses the one it had. The
// error also carries errdefs.ErrUnauthenticated or ErrPermissionDenied.
var ErrAccessRefused = errors.New("the registry refused access")

// RegistryOf is the registry host[:port] ref pulls from (a reference
// without one resolves against Config.Registry), or "" for a reference
// that does not parse.
func (s *Store) RegistryOf(ref string) string {
	r, err := name.ParseReference(ref, name.WithDefaultRegistry(s.cfg.Registry))
	if err != nil {
		return ""
	}
	return r.Context().RegistryStr()
}

// errPlainHTTP refuses plain HTTP to a registry not listed as insecure.
var errPlainHTTP = errors.New("plain HTTP refused")

// schemeGuard stops go-containerregistry from speaking plain HTTP to a
// loopback or RFC 1918 registry the operator did not mark insecure.
type schemeGuard struct {
	insecure []string
	next     http.RoundTripper
}

func (g schemeGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !slices.Contains(g.insecure, req.URL.Host) {
		return nil, fmt.Errorf("%w: %s is not in InsecureRegistries", errPlainHTTP, req.URL.Host)
	}
	return g.next.RoundTrip(req)
}

// Transport is the store's HTTP transport for other registry clients on
// this node (an image build's pushes): plain HTTP only to
// InsecureRegistries, as for pulls.
func (s *Store) Transport() http.RoundTripper {
	return schemeGuard{insecure: s.cfg.InsecureRegistries, next: s.cfg.Transport}
}

// registryClient talks to one repository with an authenticated transport.
type registryClient struct {
	repo   name.Repository
	client *http.Client
	// authed is true when the client presents a login.
	authed bool
}

func (s *Store) newClient(ctx context.Context, repo name.Repository, kc Keychain) (*registryClient, error) {
	auth, err := s.authenticator(ctx, repo.RegistryStr(), kc)
	if err != nil {
		return nil, err
	}
	anonymous := auth == authn.Anonymous
	if anonymous {
		if c := s.kept(repo); c != nil {
			return c, nil
		}
	}
	base := schemeGuard{insecure: s.cfg.InsecureRegistries, next: s.cfg.Transport}
	rt, err := transport.NewWithContext(ctx, repo.Registry, auth, base, []string{repo.Scope(transport.PullScope)})
	if err != nil {
		return nil, classify(fmt.Errorf("registry %s: authenticate: %w", repo.RegistryStr(), err), err)
	}
	c := &registryClient{repo: repo, client: &http.Client{Transport: rt}, authed: !anonymous}
	if anonymous {
		s.clientsMu.Lock()
		s.clients[repo.String()] = keptClient{c: c, made: time.Now()}
		s.clientsMu.Unlock()
	}
	return c, nil
}

// clientTTL is how long an anonymous client is kept. Making one pings the
// registry (an insecure one over HTTPS first), a round trip or two every
// pull of a tag paid again; a kept client's bearer token, if the registry
// gives one, renews itself on a 401.
const clientTTL = 5 * time.Minute

// keptClient is an anonymous client and when it was made.
type keptClient struct {
	c    *registryClient
	made time.Time
}

// kept returns repo's anonymous client if one was made less than
// clientTTL ago.
func (s *Store) kept(repo name.Repository) *registryClient {
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	k, ok := s.clients[repo.String()]
	if !ok || time.Since(k.made) > clientTTL {
		delete(s.clients, repo.String())
		return nil
	}
	return k.c
}

// forgetClient drops repo's kept client after a failure, so the next pull
// asks the registry afresh how to log in.
func (s *Store) forgetClient(repo name.Repository) {
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	delete(s.clients, repo.String())
}

func (c *registryClient) url(kind, ref string) string {
	return fmt.Sprintf("%s://%s/v2/%s/%s/%s", c.repo.Scheme(), c.repo.RegistryStr(), c.repo.RepositoryStr(), kind, ref)
}

// classify maps a registry failure onto an error kind; wrapped is the
// message to return, cause what to inspect.
func classify(wrapped, cause error) error {
	var te *transport.Error
	switch {
	case errors.Is(cause, context.Canceled), errors.Is(cause, context.DeadlineExceeded):
		return wrapped
	case errors.Is(cause, errPlainHTTP):
		return fmt.Errorf("%w: %w", wrapped, errdefs.ErrPermissionDenied)
	case errors.As(cause, &te):
		switch te.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("%w: %w", wrapped, errdefs.ErrNotFound)
		case http.StatusUnauthorized:
			return fmt.Errorf("%w: %w: %w", wrapped, ErrAccessRefused, errdefs.ErrUnauthenticated)
		case http.StatusForbidden:
			return fmt.Errorf("%w: %w: %w", wrapped, ErrAccessRefused, errdefs.ErrPermissionDenied)
		}
	}
	return fmt.Errorf("%w: %w", wrapped, errdefs.ErrUnavailable)
}

// manifest fetches a manifest by tag or digest, verifies it against the
// requested digest (or the registry's Docker-Content-Digest for a tag) and
// returns its bytes, media type and digest.
func (c *registryClient) manifest(ctx context.Context, ref string) ([]byte, types.MediaType, v1.Hash, error) {
	what := fmt.Sprintf("manifest %s@%s", c.repo, ref)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("manifests", ref), nil)
	if err != nil {
		return nil, "", v1.Hash{}, fmt.Errorf("%s: %w", what, err)
	}
	accept := make([]string, len(acceptedManifests))
	for i, mt := range acceptedManifests {
		accept[i] = string(mt)
	}
	req.Header.Set("Accept", strings.Join(accept, ","))
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, "", v1.Hash{}, classify(fmt.Errorf("%s: %w", what, err), err)
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		return nil, "", v1.Hash{}, classify(fmt.Errorf("%s: %w", what, err), err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxManifestSize+1))
	if err != nil {
		return nil, "", v1.Hash{}, classify(fmt.Errorf("%s: read: %w", what, err), err)
	}
	if len(body) > maxManifestSize {
		return nil, "", v1.Hash{}, fmt.Errorf("%s: larger than %d bytes: %w", what, maxManifestSize, errdefs.ErrInvalidArgument)
	}
	got := v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sha256.Sum256(body))}
	want := ref
	if !strings.HasPrefix(ref, "sha256:") {
		want = resp.Header.Get("Docker-Content-Digest")
	}
	if want != "" && want != got.String() {
		return nil, "", v1.Hash{}, fmt.Errorf("%s: %w: registry sent %s, want %s", what, ErrDigestMismatch, got, want)
	}
	mt := types.MediaType(strings.TrimSpace(strings.Split(resp.Header.Get("Content-Type"), ";")[0]))
	if peek := peekMediaType(body); peek != "" {
		mt = peek
	}
	if !slices.Contains(acceptedManifests, mt) {
		return nil, "", v1.Hash{}, fmt.Errorf("%s: unsupported media type %q: %w", what, mt, errdefs.ErrInvalidArgument)
	}
	return body, mt, got, nil
}

// peekMediaType reads mediaType from the manifest itself, which is covered by
// the digest, unlike the Content-Type header.
func peekMediaType(body []byte) types.MediaType {
	var probe struct {
		MediaType types.MediaType `json:"mediaType"`
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		return ""
	}
	return probe.MediaType
}

// fetchBlob downloads a blob into the cache unless present, verifying size
// and sha256 while writing to a temp file that is renamed only when both
// match. It returns the bytes downloaded (0 for a cache hit).
func (s *Store) fetchBlob(ctx context.Context, c *registryClient, want v1.Hash, size int64) (int64, error) {
	what := fmt.Sprintf("blob %s@%s", c.repo, want)
	if want.Algorithm != "sha256" || !hexRE.MatchString(want.Hex) {
		return 0, fmt.Errorf("%s: unsupported digest: %w", what, errdefs.ErrInvalidArgument)
	}
	if size < 0 || size > s.cfg.MaxBlobSize {
		return 0, fmt.Errorf("%s: size %d outside [0, %d]: %w", what, size, s.cfg.MaxBlobSize, errdefs.ErrInvalidArgument)
	}
	final := s.blobPath(want.Hex)
	if _, err := os.Stat(final); err == nil {
		return 0, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("blobs", want.String()), nil)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, classify(fmt.Errorf("%s: %w", what, err), err)
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		return 0, classify(fmt.Errorf("%s: %w", what, err), err)
	}
	f, err := os.CreateTemp(s.path("tmp"), "blob-"+want.Hex[:12]+"-*")
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, size+1))
	if err != nil {
		_ = f.Close()
		return n, classify(fmt.Errorf("%s: download: %w", what, err), err)
	}
	got := fmt.Sprintf("sha256:%x", h.Sum(nil))
	if n != size || got != want.String() {
		_ = f.Close()
		return n, fmt.Errorf("%s: %w: registry sent %s (%d bytes), want %s (%d bytes)", what, ErrDigestMismatch, got, n, want, size)
	}
	if err := f.Chmod(0o644); err != nil {
		_ = f.Close()
		return n, fmt.Errorf("%s: %w", what, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return n, fmt.Errorf("%s: sync: %w", what, err)
	}
	if err := f.Close(); err != nil {
		return n, fmt.Errorf("%s: %w", what, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return n, fmt.Errorf("%s: store: %w", what, err)
	}
	return n, nil
}
