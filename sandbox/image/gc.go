package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// GCResult says what a garbage collection did.
type GCResult struct {
	// Evicted are the digests removed, least recently used first.
	Evicted []string
	// UsedBytes is what the cache holds afterwards.
	UsedBytes int64
}

// GC evicts least-recently-used images until blobs plus unpacked trees fit
// Config.DiskBudget. It never evicts an image that is mounted (by this
// process, per /proc/self/mountinfo, or locked by another process) or used
// within Config.GCGrace, so the cache may stay above budget. A zero budget makes GC a no-op. Safe to call
// concurrently with Pull and Mount.
func (s *Store) GC(ctx context.Context) (GCResult, error) {
	return s.gc(ctx, "")
}

type gcCandidate struct {
	hex     string
	rec     record
	lastUse time.Time
}

func (s *Store) gc(ctx context.Context, keep string) (GCResult, error) {
	var res GCResult
	cands, used, err := s.usage()
	if err != nil {
		return res, fmt.Errorf("image gc: %w", err)
	}
	res.UsedBytes = used
	defer func() { s.metrics.diskBytes.Set(float64(res.UsedBytes)) }()
	if s.cfg.DiskBudget <= 0 || used <= s.cfg.DiskBudget {
		return res, nil
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].lastUse.Before(cands[j].lastUse) })
	for _, c := range cands {
		if res.UsedBytes <= s.cfg.DiskBudget {
			break
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if c.hex == keep || s.cfg.Clock.Since(c.lastUse) < s.cfg.GCGrace {
			continue
		}
		evicted, err := s.evict(c.hex)
		if err != nil {
			return res, fmt.Errorf("image gc: evict sha256:%s: %w", c.hex, err)
		}
		if !evicted {
			continue
		}
		res.Evicted = append(res.Evicted, "sha256:"+c.hex)
		s.metrics.evictions.Inc()
		s.log.Info("image evicted", "digest", "sha256:"+c.hex, "last_use", c.lastUse)
		_, res.UsedBytes, err = s.usage()
		if err != nil {
			return res, fmt.Errorf("image gc: %w", err)
		}
	}
	return res, nil
}

// usage returns complete images and the bytes of all blobs plus unpacked trees.
func (s *Store) usage() ([]gcCandidate, int64, error) {
	ents, err := os.ReadDir(s.path("images"))
	if err != nil {
		return nil, 0, err
	}
	var cands []gcCandidate
	var used int64
	for _, e := range ents {
		hex, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !hexRE.MatchString(hex) {
			continue
		}
		rec, err := s.readRecord(hex)
		if err != nil {
			continue
		}
		fi, err := os.Stat(s.recordPath(hex))
		if err != nil {
			continue
		}
		cands = append(cands, gcCandidate{hex: hex, rec: rec, lastUse: fi.ModTime()})
		used += rec.UnpackedBytes
	}
	blobs, err := s.blobHexes()
	if err != nil {
		return nil, 0, err
	}
	for _, n := range blobs {
		used += n
	}
	return cands, used, nil
}

// evict removes one image unless it is mounted or another process holds its
// lock; evicted=false means it was skipped.
func (s *Store) evict(hex string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mounts[hex] > 0 {
		return false, nil
	}
	lock, ok, err := tryLockPath(s.lockPath(hex), unix.LOCK_EX)
	if err != nil || !ok {
		return false, err
	}
	defer lock.unlock()
	lowers, err := mountedLowers()
	if err != nil {
		return false, err
	}
	if lowers[s.rootfsPath(hex)] {
		return false, nil
	}
	rec, err := s.readRecord(hex)
	if err != nil {
		return false, nil
	}
	// The record goes first: without it the image is incomplete, so a
	// crash half-way leaves only garbage that Reconcile removes.
	if err := os.Remove(s.recordPath(hex)); err != nil {
		return false, err
	}
	trash, err := os.MkdirTemp(s.path("tmp"), "gc-"+hex[:12]+"-")
	if err != nil {
		return true, err
	}
	if err := os.Rename(s.rootfsPath(hex), trash+"/rootfs"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return true, err
	}
	if err := os.RemoveAll(trash); err != nil {
		return true, err
	}
	s.dropRefs("sha256:" + hex)
	return true, s.dropUnreferencedBlobsLocked(rec)
}

// dropRefs forgets tags and index digests that resolved to digest.
func (s *Store) dropRefs(digest string) {
	ents, _ := os.ReadDir(s.path("refs"))
	for _, e := range ents {
		p := s.path("refs", e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var r refEntry
		if json.Unmarshal(b, &r) == nil && r.Digest == digest {
			_ = os.Remove(p)
		}
	}
}

// dropUnreferencedBlobsLocked deletes the evicted image's blobs that no remaining
// image and no pull in progress in this process uses. s.mu must be held.
func (s *Store) dropUnreferencedBlobsLocked(evicted record) error {
	inUse := map[string]bool{}
	cands, _, err := s.usage()
	if err != nil {
		return err
	}
	for _, c := range cands {
		for _, b := range c.rec.Blobs {
			inUse[b.Digest] = true
		}
	}
	var errs []error
	for _, b := range evicted.Blobs {
		if inUse[b.Digest] || s.inflight[b.Digest] > 0 {
			continue
		}
		hex, err := parseDigest(b.Digest)
		if err != nil {
			continue
		}
		if err := os.Remove(s.blobPath(hex)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
