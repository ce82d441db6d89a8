package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/levers9/levers9/internal/errdefs"
)

// VolumeState is a volume row's state (see migrations/00014_volumes.sql).
type VolumeState string

// The volume states.
const (
	VolumeReady    VolumeState = "READY"
	VolumeDeleting VolumeState = "DELETING"
)

// Volume is a row of volumes.
type Volume struct {
	ID          string
	WorkspaceID string
	Name        string
	Driver      string
	QuotaBytes  int64
	State       VolumeState
	CreatedAt   time.Time
}

const volumeCols = `id, workspace_id, name, driver, quota_bytes, state, created_at`

func scanVolume(r interface{ Scan(...any) error }) (Volume, error) {
	var v Volume
	err := r.Scan(&v.ID, &v.WorkspaceID, &v.Name, &v.Driver, &v.QuotaBytes, &v.State, &v.CreatedAt)
	return v, err
}

// InsertVolume stores a new READY volume; a name taken in the workspace
// is ErrAlreadyExists.
func (s *Store) InsertVolume(ctx context.Context, v Volume) (Volume, error) {
	row := s.pool.QueryRow(ctx, `INSERT INTO volumes (id, workspace_id, name, driver, quota_bytes)
		VALUES ($1, $2, $3, $4, $5) RETURNING `+volumeCols, v.ID, v.WorkspaceID, v.Name, v.Driver, v.QuotaBytes)
	out, err := scanVolume(row)
	return out, wrap("create volume "+v.Name, err)
}

// GetVolume returns a workspace's volume by name; another workspace's is
// not found.
func (s *Store) GetVolume(ctx context.Context, wsID, name string) (Volume, error) {
	v, err := scanVolume(s.pool.QueryRow(ctx, `SELECT `+volumeCols+` FROM volumes WHERE workspace_id = $1 AND name = $2`, wsID, name))
	return v, wrap("get volume "+name, err)
}

// ListVolumes lists a workspace's volumes by name.
func (s *Store) ListVolumes(ctx context.Context, wsID string) ([]Volume, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+volumeCols+` FROM volumes WHERE workspace_id = $1 ORDER BY name`, wsID)
	if err != nil {
		return nil, wrap("list volumes", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Volume, error) { return scanVolume(r) })
	return out, wrap("list volumes", err)
}

// activeUsersSQL selects the unfinished tasks of workspace $1 whose spec
// mounts volume $2 (TaskSpec.volumes holds {"name": ...} objects).
const activeUsersSQL = `SELECT id FROM tasks
	WHERE workspace_id = $1 AND state IN ('PENDING', 'SCHEDULED', 'RUNNING')
	AND spec->'volumes' @> jsonb_build_array(jsonb_build_object('name', $2::text))
	ORDER BY created_at, id`

// VolumeUsers returns the ids of the unfinished tasks that mount a volume.
func (s *Store) VolumeUsers(ctx context.Context, wsID, name string) ([]string, error) {
	rows, err := s.pool.Query(ctx, activeUsersSQL, wsID, name)
	if err != nil {
		return nil, wrap("tasks using volume "+name, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return ids, wrap("tasks using volume "+name, err)
}

// MarkVolumeDeleting moves a volume to DELETING unless an unfinished task
// uses it (ErrFailedPrecondition naming them). The volume row is locked
// while the tasks are checked, so two deletes do not race; a task
// submitted in the same instant is refused by its own check of the state.
func (s *Store) MarkVolumeDeleting(ctx context.Context, wsID, name string) (Volume, error) {
	var out Volume
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		v, err := scanVolume(tx.QueryRow(ctx, `SELECT `+volumeCols+` FROM volumes WHERE workspace_id = $1 AND name = $2 FOR UPDATE`, wsID, name))
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, activeUsersSQL, wsID, name)
		if err != nil {
			return err
		}
		users, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return fmt.Errorf("volume %s is used by unfinished tasks %v: %w", name, users, errdefs.ErrFailedPrecondition)
		}
		out, err = scanVolume(tx.QueryRow(ctx, `UPDATE volumes SET state = 'DELETING', updated_at = now()
			WHERE id = $1 RETURNING `+volumeCols, v.ID))
		return err
	})
	if errdefs.IsFailedPrecondition(err) {
		return out, fmt.Errorf("delete volume %s: %w", name, err)
	}
	return out, wrap("delete volume "+name, err)
}

// DeleteVolumeRow removes a volume's row (after the driver deleted its
// data).
func (s *Store) DeleteVolumeRow(ctx context.Context, id string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM volumes WHERE id = $1`, id)
	if err != nil {
		return wrap("delete volume "+id, err)
	}
	if tag.RowsAffected() == 0 {
		return wrap("delete volume "+id, pgx.ErrNoRows)
	}
	return nil
}
