package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// PushOptions says where an image goes.
type PushOptions struct {
	// Registry is host[:port]/prefix; the image is Registry/NAME.
	Registry string
	// Tag is the tag deployments follow (default latest).
	Tag string
	// Revision names the run tag (its first 12 characters).
	Revision string
	// Now times the run tag.
	Now time.Time
	// Insecure allows plain HTTP to a registry that is not on loopback;
	// loopback registries always get plain HTTP.
	Insecure bool
	Log      io.Writer
}

// Pushed says where an image went.
type Pushed struct {
	Repository string // Registry/NAME
	Digest     string
	Tag        string
	RunTag     string
}

// maxRunTagTries bounds the suffixes tried when a run tag is taken.
const maxRunTagTries = 100

// RunTag is sha-<revision[:12]>-<UTC yyyymmddhhmmss>.
func RunTag(revision string, now time.Time) string {
	if len(revision) > 12 {
		revision = revision[:12]
	}
	return fmt.Sprintf("sha-%s-%s", revision, now.UTC().Format("20060102150405"))
}

// Push writes img as Registry/NAME:Tag and under a run tag that no build
// before it used: when RunTag is taken (two builds in one second), -2, -3
// and so on are tried.
func Push(ctx context.Context, img *Image, p PushOptions) (Pushed, error) {
	if p.Log == nil {
		p.Log = io.Discard
	}
	if p.Tag == "" {
		p.Tag = "latest"
	}
	repoName := strings.TrimSuffix(p.Registry, "/") + "/" + img.Name
	var nopts []name.Option
	if p.Insecure || loopbackRegistry(repoName) {
		nopts = append(nopts, name.Insecure)
	}
	repo, err := name.NewRepository(repoName, nopts...)
	if err != nil {
		return Pushed{}, fmt.Errorf("push %s: %w", img.Name, err)
	}
	// Credentials come from the usual docker config (docker login, a
	// credential helper), never from flags.
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	digest, err := img.Digest()
	if err != nil {
		return Pushed{}, fmt.Errorf("push %s: %w", img.Name, err)
	}
	runTag, err := freeRunTag(repo, RunTag(p.Revision, p.Now), ropts)
	if err != nil {
		return Pushed{}, err
	}
	tag := repo.Tag(p.Tag)
	fmt.Fprintf(p.Log, "images: pushing %s (%s)\n", tag, digest)
	if img.Index != nil {
		err = remote.WriteIndex(tag, img.Index, ropts...)
	} else {
		err = remote.Write(tag, img.Image, ropts...)
	}
	if err != nil {
		return Pushed{}, fmt.Errorf("push %s: %w", tag, err)
	}
	rt := repo.Tag(runTag)
	taggable := remote.Taggable(img.Image)
	if img.Index != nil {
		taggable = img.Index
	}
	if err := remote.Tag(rt, taggable, ropts...); err != nil {
		return Pushed{}, fmt.Errorf("tag %s: %w", rt, err)
	}
	fmt.Fprintf(p.Log, "images: pushed %s and %s\n", tag, rt)
	return Pushed{Repository: repo.String(), Digest: digest.String(), Tag: p.Tag, RunTag: runTag}, nil
}

// freeRunTag returns base, or base-N for the first N that repo does not
// have yet.
func freeRunTag(repo name.Repository, base string, ropts []remote.Option) (string, error) {
	for i := 1; i <= maxRunTagTries; i++ {
		t := base
		if i > 1 {
			t = fmt.Sprintf("%s-%d", base, i)
		}
		_, err := remote.Head(repo.Tag(t), ropts...)
		var terr *transport.Error
		if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
			return t, nil
		}
		if err != nil {
			return "", fmt.Errorf("check run tag %s: %w", repo.Tag(t), err)
		}
	}
	return "", fmt.Errorf("run tag %s: %d builds already used it", base, maxRunTagTries)
}

// loopbackRegistry reports whether the reference's registry is on this
// machine's loopback, the only place plain HTTP goes without --insecure.
func loopbackRegistry(ref string) bool {
	host, _, _ := strings.Cut(ref, "/")
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
