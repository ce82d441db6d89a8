package seaweed

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"time"
)

// Filer speaks the filer's HTTP API. Paths are absolute filer paths
// ("/levers9/ws/vol"). Safe for concurrent use.
type Filer struct {
	// URL is the filer's base URL, http://host:port.
	URL    string
	Client *http.Client
	// Keys sign each request (a secured filer refuses one without).
	Keys FilerKeys
}

// Entry is one directory entry as the filer lists it.
type Entry struct {
	FullPath string
	Mode     os.FileMode
	FileSize uint64
	Mtime    time.Time
	// Chunks is only counted: a file's size is the larger of FileSize and
	// the sum of its chunks.
	Chunks []struct {
		Size uint64 `json:"size"`
	} `json:"chunks"`
}

// IsDir reports whether the entry is a directory.
func (e Entry) IsDir() bool { return e.Mode&os.ModeDir != 0 }

// Size is the file's length in bytes.
func (e Entry) Size() uint64 {
	var s uint64
	for _, c := range e.Chunks {
		s += c.Size
	}
	return max(s, e.FileSize)
}

// Name is the entry's base name.
func (e Entry) Name() string { return path.Base(e.FullPath) }

func (f *Filer) client() *http.Client {
	if f.Client != nil {
		return f.Client
	}
	return http.DefaultClient
}

func (f *Filer) url(p string, q url.Values) string {
	u := strings.TrimRight(f.URL, "/") + (&url.URL{Path: p}).EscapedPath()
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

func (f *Filer) do(ctx context.Context, method, p string, q url.Values, body io.Reader, hdr map[string]string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, f.url(p, q), body)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	key := f.Keys.Write
	if method == http.MethodGet || method == http.MethodHead {
		key = f.Keys.Read
	}
	if len(key) > 0 {
		req.Header.Set("Authorization", "Bearer "+filerToken(key, 30*time.Second))
	}
	return f.client().Do(req)
}

// Mkdir creates a directory and its parents; an existing one is fine.
func (f *Filer) Mkdir(ctx context.Context, dir string) error {
	resp, err := f.do(ctx, http.MethodPost, strings.TrimRight(dir, "/")+"/", nil, nil, nil)
	if err != nil {
		return fmt.Errorf("creating filer directory %s: %w", dir, err)
	}
	defer resp.Body.Close()
	// 409 Conflict is the filer's answer for a directory already there.
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusConflict {
		return fmt.Errorf("creating filer directory %s: %s: %s", dir, resp.Status, readSome(resp.Body))
	}
	return nil
}

// ErrNotFound is returned (wrapped) for a path the filer does not have.
var ErrNotFound = fmt.Errorf("not found on the filer")

// List returns a directory's entries, all pages of them.
func (f *Filer) List(ctx context.Context, dir string) ([]Entry, error) {
	var all []Entry
	last := ""
	for {
		q := url.Values{"limit": {"1000"}}
		if last != "" {
			q.Set("lastFileName", last)
		}
		resp, err := f.do(ctx, http.MethodGet, strings.TrimRight(dir, "/")+"/", q, nil, map[string]string{"Accept": "application/json"})
		if err != nil {
			return nil, fmt.Errorf("listing filer directory %s: %w", dir, err)
		}
		if resp.StatusCode == http.StatusNotFound {
			resp.Body.Close()
			return nil, fmt.Errorf("listing filer directory %s: %w", dir, ErrNotFound)
		}
		if resp.StatusCode != http.StatusOK {
			msg := readSome(resp.Body)
			resp.Body.Close()
			return nil, fmt.Errorf("listing filer directory %s: %s: %s", dir, resp.Status, msg)
		}
		var page struct {
			Entries               []Entry
			LastFileName          string
			ShouldDisplayLoadMore bool
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("listing filer directory %s: decoding: %w", dir, err)
		}
		all = append(all, page.Entries...)
		if !page.ShouldDisplayLoadMore || page.LastFileName == "" || len(page.Entries) == 0 {
			return all, nil
		}
		last = page.LastFileName
	}
}

// Usage is what a directory tree holds.
type Usage struct {
	Bytes uint64
	Files uint64
	Dirs  uint64
}

// Usage walks a directory tree and adds up its files' sizes and counts.
// It lists every directory, so it costs one request per directory.
func (f *Filer) Usage(ctx context.Context, dir string) (Usage, error) {
	var u Usage
	stack := []string{dir}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		entries, err := f.List(ctx, d)
		if err != nil {
			return u, err
		}
		for _, e := range entries {
			if e.IsDir() {
				u.Dirs++
				stack = append(stack, e.FullPath)
				continue
			}
			u.Files++
			u.Bytes += e.Size()
		}
	}
	return u, nil
}

// Put writes a file at p from r, replacing one there.
func (f *Filer) Put(ctx context.Context, p string, r io.Reader) error {
	return f.PutIn(ctx, p, "", r)
}

// PutIn is Put with the file's chunks in collection (empty: the filer's
// default), so they count against that collection's quota.
func (f *Filer) PutIn(ctx context.Context, p, collection string, r io.Reader) error {
	var q url.Values
	if collection != "" {
		q = url.Values{"collection": {collection}}
	}
	resp, err := f.do(ctx, http.MethodPut, p, q, r, map[string]string{"Content-Type": "application/octet-stream"})
	if err != nil {
		return fmt.Errorf("writing filer file %s: %w", p, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("writing filer file %s: %s: %s", p, resp.Status, readSome(resp.Body))
	}
	return nil
}

// Get opens the file at p; the caller closes it.
func (f *Filer) Get(ctx context.Context, p string) (io.ReadCloser, error) {
	resp, err := f.do(ctx, http.MethodGet, p, nil, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("reading filer file %s: %w", p, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		resp.Body.Close()
		return nil, fmt.Errorf("reading filer file %s: %w", p, ErrNotFound)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("reading filer file %s: %s: %s", p, resp.Status, readSome(resp.Body))
	}
	return resp.Body, nil
}

// Rename moves the file or directory at from to to, replacing a file
// there: the filer does it as one metadata change, so a reader sees the
// old file or the new one, never a part.
func (f *Filer) Rename(ctx context.Context, from, to string) error {
	resp, err := f.do(ctx, http.MethodPost, to, url.Values{"mv.from": {from}}, nil, nil)
	if err != nil {
		return fmt.Errorf("renaming filer path %s to %s: %w", from, to, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("renaming filer path %s to %s: %s: %s", from, to, resp.Status, readSome(resp.Body))
	}
	return nil
}

// Stat returns the entry at p by listing its parent (the filer answers a
// GET of a file with its content, not its metadata).
func (f *Filer) Stat(ctx context.Context, p string) (Entry, error) {
	p = path.Clean(p)
	entries, err := f.List(ctx, path.Dir(p))
	if err != nil {
		return Entry{}, fmt.Errorf("stat of filer path %s: %w", p, err)
	}
	for _, e := range entries {
		if path.Clean(e.FullPath) == p {
			return e, nil
		}
	}
	return Entry{}, fmt.Errorf("stat of filer path %s: %w", p, ErrNotFound)
}

// Delete removes a file or a directory tree; a missing one is fine.
func (f *Filer) Delete(ctx context.Context, p string) error {
	q := url.Values{"recursive": {"true"}, "ignoreRecursiveError": {"true"}}
	resp, err := f.do(ctx, http.MethodDelete, p, q, nil, nil)
	if err != nil {
		return fmt.Errorf("deleting filer path %s: %w", p, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("deleting filer path %s: %s: %s", p, resp.Status, readSome(resp.Body))
	}
	return nil
}

func readSome(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 512))
	return strings.TrimSpace(string(b))
}
