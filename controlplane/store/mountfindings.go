package store

import (
	"context"
	"time"
)

// PoolMountFinding is a finding of one task.
type PoolMountFinding struct {
	TaskID string
	MountFinding
}

// PoolMounts is what volume mount validation judged for a workspace's tasks
// of a pool created since a time.
type PoolMounts struct {
	// WithVolumes counts the tasks that asked for volumes; WithFindings
	// those of them with a mount enforce would refuse.
	WithVolumes, WithFindings int
	// Findings are the newest tasks' findings, at most maxMountFindings.
	Findings []PoolMountFinding
}

// maxMountFindings bounds the findings a pool report lists.
const maxMountFindings = 50

// PoolMountFindings sums the mount findings of a workspace's tasks in a pool
// created at or after since, newest task first.
func (s *Store) PoolMountFindings(ctx context.Context, workspaceID, pool string, since time.Time) (PoolMounts, error) {
	var out PoolMounts
	err := s.pool.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE jsonb_typeof(spec->'volumes') = 'array' AND jsonb_array_length(spec->'volumes') > 0),
		count(*) FILTER (WHERE jsonb_array_length(mount_findings) > 0)
		FROM tasks WHERE workspace_id = $1 AND pool = $2 AND created_at >= $3`, workspaceID, pool, since).
		Scan(&out.WithVolumes, &out.WithFindings)
	if err != nil {
		return out, wrap("pool mount findings "+pool, err)
	}
	rows, err := s.pool.Query(ctx, `SELECT t.id, coalesce(f.e->>'volume', ''), coalesce(f.e->>'path', ''), coalesce(f.e->>'reason', '')
		FROM tasks t, jsonb_array_elements(t.mount_findings) WITH ORDINALITY AS f(e, n)
		WHERE t.workspace_id = $1 AND t.pool = $2 AND t.created_at >= $3 AND jsonb_array_length(t.mount_findings) > 0
		ORDER BY t.created_at DESC, t.id, f.n LIMIT $4`, workspaceID, pool, since, maxMountFindings)
	if err != nil {
		return out, wrap("pool mount findings "+pool, err)
	}
	defer rows.Close()
	for rows.Next() {
		var f PoolMountFinding
		if err := rows.Scan(&f.TaskID, &f.Volume, &f.Path, &f.Reason); err != nil {
			return out, wrap("scan pool mount findings", err)
		}
		out.Findings = append(out.Findings, f)
	}
	return out, wrap("pool mount findings "+pool, rows.Err())
}
