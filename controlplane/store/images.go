package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/levers9/levers9/internal/errdefs"
)

// ImageState is an images row's state (see migrations/00016_images.sql).
type ImageState string

// The image states.
const (
	ImageBuilding ImageState = "BUILDING"
	ImageReady    ImageState = "READY"
	ImageFailed   ImageState = "FAILED"
)

// Image is a row of images: one recipe a workspace built (or builds).
type Image struct {
	WorkspaceID string
	Hash        string
	State       ImageState
	Recipe      []byte
	// Base is the base reference as the user gave it, resolved (by digest).
	Base       string
	BaseDigest string
	Steps      int
	// StartStep and Parent say where the current build starts.
	StartStep  int
	Parent     string
	Generation int
	BuildKey   string
	TaskID     string
	Digest     string
	Ref        string
	SizeBytes  int64
	Error      string
	CreatedAt  time.Time
	BuiltAt    *time.Time
}

const imageCols = `workspace_id, hash, state, recipe, base, base_digest, steps, start_step, parent, generation,
	build_key, task_id, digest, ref, size_bytes, error, created_at, built_at`

func scanImage(r interface{ Scan(...any) error }) (Image, error) {
	var i Image
	err := r.Scan(&i.WorkspaceID, &i.Hash, &i.State, &i.Recipe, &i.Base, &i.BaseDigest, &i.Steps, &i.StartStep, &i.Parent,
		&i.Generation, &i.BuildKey, &i.TaskID, &i.Digest, &i.Ref, &i.SizeBytes, &i.Error, &i.CreatedAt, &i.BuiltAt)
	return i, err
}

// BuildDecision is what BeginImageBuild found and did.
type BuildDecision int

// The decisions.
const (
	// BuildStarted: a new generation is BUILDING; submit its task.
	BuildStarted BuildDecision = iota
	// BuildJoined: a build of the recipe is running; follow its task.
	BuildJoined
	// BuildCached: the image is READY.
	BuildCached
)

// BeginImageBuild decides, under the row's lock, whether a recipe needs a
// build: a READY image is cached (unless force), a BUILDING one is joined,
// and anything else becomes a new BUILDING generation whose build_key is
// keyFor(generation). want carries the recipe, base, steps and where the
// build starts.
func (s *Store) BeginImageBuild(ctx context.Context, want Image, force bool, keyFor func(gen int) string) (Image, BuildDecision, error) {
	var out Image
	var dec BuildDecision
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := scanImage(tx.QueryRow(ctx, `SELECT `+imageCols+` FROM images WHERE workspace_id = $1 AND hash = $2 FOR UPDATE`,
			want.WorkspaceID, want.Hash))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			out, err = scanImage(tx.QueryRow(ctx, `INSERT INTO images (workspace_id, hash, state, recipe, base, base_digest, steps,
				start_step, parent, generation, build_key) VALUES ($1, $2, 'BUILDING', $3, $4, $5, $6, $7, $8, 1, $9)
				ON CONFLICT (workspace_id, hash) DO NOTHING RETURNING `+imageCols,
				want.WorkspaceID, want.Hash, want.Recipe, want.Base, want.BaseDigest, want.Steps, want.StartStep, want.Parent, keyFor(1)))
			if errors.Is(err, pgx.ErrNoRows) {
				// Another caller inserted it between our select and insert.
				return errRetryBuild
			}
			dec = BuildStarted
			return err
		case err != nil:
			return err
		case cur.State == ImageBuilding:
			out, dec = cur, BuildJoined
			return nil
		case cur.State == ImageReady && !force:
			out, dec = cur, BuildCached
			return nil
		}
		gen := cur.Generation + 1
		out, err = scanImage(tx.QueryRow(ctx, `UPDATE images SET state = 'BUILDING', recipe = $3, base = $4, base_digest = $5,
			steps = $6, start_step = $7, parent = $8, generation = $9, build_key = $10, task_id = '', error = '', created_at = now()
			WHERE workspace_id = $1 AND hash = $2 RETURNING `+imageCols,
			want.WorkspaceID, want.Hash, want.Recipe, want.Base, want.BaseDigest, want.Steps, want.StartStep, want.Parent, gen, keyFor(gen)))
		dec = BuildStarted
		return err
	})
	if errors.Is(err, errRetryBuild) {
		return s.BeginImageBuild(ctx, want, force, keyFor)
	}
	return out, dec, wrap("begin build of image "+want.Hash, err)
}

var errRetryBuild = errors.New("image row inserted concurrently")

// SetImageTask records the task of a build generation.
func (s *Store) SetImageTask(ctx context.Context, wsID, hash, buildKey, taskID string) error {
	_, err := s.pool.Exec(ctx, `UPDATE images SET task_id = $4 WHERE workspace_id = $1 AND hash = $2 AND build_key = $3`,
		wsID, hash, buildKey, taskID)
	return wrap("record the build task of image "+hash, err)
}

// ImageByBuildKey returns the image a build task (by its idempotency key)
// builds; a task that builds nothing is ErrNotFound.
func (s *Store) ImageByBuildKey(ctx context.Context, wsID, buildKey string) (Image, error) {
	i, err := scanImage(s.pool.QueryRow(ctx, `SELECT `+imageCols+` FROM images WHERE workspace_id = $1 AND build_key = $2`, wsID, buildKey))
	return i, wrap("image built by "+buildKey, err)
}

// GetImage returns a workspace's image by hash; another workspace's is not
// found.
func (s *Store) GetImage(ctx context.Context, wsID, hash string) (Image, error) {
	i, err := scanImage(s.pool.QueryRow(ctx, `SELECT `+imageCols+` FROM images WHERE workspace_id = $1 AND hash = $2`, wsID, hash))
	return i, wrap("get image "+hash, err)
}

// ListImages lists a workspace's images, newest first.
func (s *Store) ListImages(ctx context.Context, wsID string) ([]Image, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+imageCols+` FROM images WHERE workspace_id = $1 ORDER BY created_at DESC, hash`, wsID)
	if err != nil {
		return nil, wrap("list images", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Image, error) { return scanImage(r) })
	return out, wrap("list images", err)
}

// ImageEnd is how a build generation ended.
type ImageEnd struct {
	Ready     bool
	Digest    string
	Ref       string
	SizeBytes int64
	Error     string
	// Steps are the step images the build pushed, by key.
	Steps map[string]string
	At    time.Time
}

// FinishImageBuild records the end of generation buildKey (a later
// generation is left alone: ok=false) and the step images it made.
func (s *Store) FinishImageBuild(ctx context.Context, wsID, hash, buildKey string, end ImageEnd) (Image, bool, error) {
	var out Image
	ok := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		state := ImageFailed
		if end.Ready {
			state = ImageReady
		}
		var err error
		out, err = scanImage(tx.QueryRow(ctx, `UPDATE images SET state = $4, digest = $5, ref = $6, size_bytes = $7, error = $8, built_at = $9
			WHERE workspace_id = $1 AND hash = $2 AND build_key = $3 AND state = 'BUILDING' RETURNING `+imageCols,
			wsID, hash, buildKey, state, end.Digest, end.Ref, end.SizeBytes, end.Error, end.At))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		ok = true
		for key, digest := range end.Steps {
			if _, err := tx.Exec(ctx, `INSERT INTO image_steps (workspace_id, key, digest) VALUES ($1, $2, $3)
				ON CONFLICT (workspace_id, key) DO UPDATE SET digest = EXCLUDED.digest`, wsID, key, digest); err != nil {
				return err
			}
		}
		return nil
	})
	return out, ok, wrap("finish build of image "+hash, err)
}

// DeepestImageStep returns the index of the last of keys the workspace has
// a step image for, with its digest; -1 when none.
func (s *Store) DeepestImageStep(ctx context.Context, wsID string, keys []string) (int, string, error) {
	rows, err := s.pool.Query(ctx, `SELECT key, digest FROM image_steps WHERE workspace_id = $1 AND key = ANY($2)`, wsID, keys)
	if err != nil {
		return -1, "", wrap("cached image steps", err)
	}
	have := map[string]string{}
	var k, d string
	if _, err := pgx.ForEachRow(rows, []any{&k, &d}, func() error { have[k] = d; return nil }); err != nil {
		return -1, "", wrap("cached image steps", err)
	}
	// Only a prefix counts: step i's image includes steps 0..i.
	best, digest := -1, ""
	for i, key := range keys {
		d, ok := have[key]
		if !ok {
			break
		}
		best, digest = i, d
	}
	return best, digest, nil
}

// DeleteImage forgets a workspace's image and the step images of its
// recipe (stepKeys); a BUILDING one is FailedPrecondition.
func (s *Store) DeleteImage(ctx context.Context, wsID, hash string, stepKeys []string) error {
	building := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var state ImageState
		if err := tx.QueryRow(ctx, `SELECT state FROM images WHERE workspace_id = $1 AND hash = $2 FOR UPDATE`, wsID, hash).Scan(&state); err != nil {
			return err
		}
		if state == ImageBuilding {
			building = true
			return nil
		}
		if _, err := tx.Exec(ctx, `DELETE FROM image_steps WHERE workspace_id = $1 AND key = ANY($2)`, wsID, stepKeys); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM images WHERE workspace_id = $1 AND hash = $2`, wsID, hash)
		return err
	})
	if building {
		return fmt.Errorf("delete image %s: it is being built; cancel its build task first: %w", hash, errdefs.ErrFailedPrecondition)
	}
	return wrap("delete image "+hash, err)
}

// PutImageBlob records that a workspace uploaded a blob.
func (s *Store) PutImageBlob(ctx context.Context, wsID, digest string, size int64) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO image_blobs (workspace_id, digest, size_bytes) VALUES ($1, $2, $3)
		ON CONFLICT (workspace_id, digest) DO NOTHING`, wsID, digest, size)
	return wrap("record blob "+digest, err)
}

// ImageBlob returns the size of a blob the workspace uploaded; one it did
// not is ErrNotFound (even when another workspace did).
func (s *Store) ImageBlob(ctx context.Context, wsID, digest string) (int64, error) {
	var size int64
	err := s.pool.QueryRow(ctx, `SELECT size_bytes FROM image_blobs WHERE workspace_id = $1 AND digest = $2`, wsID, digest).Scan(&size)
	return size, wrap("blob "+digest, err)
}
