package store

import (
	"context"
	"sort"
	"time"
)

// SeccompCount is a syscall seccomp log mode recorded, and how often.
type SeccompCount struct {
	Syscall string
	Count   int64
}

// RecordSeccomp stores an attempt's seccomp log-mode totals (cumulative,
// as the agent sends them): each count only grows, so a resent or
// reordered report changes nothing. It also marks the attempt as observed
// under log mode, with or without syscalls.
func (s *Store) RecordSeccomp(ctx context.Context, taskID string, n int, totals []SeccompCount) error {
	names := []string{""}
	counts := []int64{0}
	for _, c := range totals {
		if c.Syscall == "" || c.Count < 0 {
			continue
		}
		names = append(names, c.Syscall)
		counts = append(counts, c.Count)
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO attempt_seccomp (task_id, attempt, syscall, count)
		SELECT $1, $2, u.syscall, u.count FROM unnest($3::text[], $4::bigint[]) AS u(syscall, count)
		ON CONFLICT (task_id, attempt, syscall) DO UPDATE SET count = GREATEST(attempt_seccomp.count, EXCLUDED.count)`,
		taskID, n, names, counts)
	return wrap("record seccomp totals of task "+taskID, err)
}

// TaskSeccomp returns a task's seccomp log-mode syscalls summed over its
// attempts, most frequent first.
func (s *Store) TaskSeccomp(ctx context.Context, taskID string) ([]SeccompCount, error) {
	rows, err := s.pool.Query(ctx, `SELECT syscall, sum(count)::bigint FROM attempt_seccomp
		WHERE task_id = $1 AND syscall <> '' GROUP BY syscall ORDER BY 2 DESC, 1`, taskID)
	if err != nil {
		return nil, wrap("list seccomp totals of task "+taskID, err)
	}
	defer rows.Close()
	var out []SeccompCount
	for rows.Next() {
		var c SeccompCount
		if err := rows.Scan(&c.Syscall, &c.Count); err != nil {
			return nil, wrap("scan seccomp totals", err)
		}
		out = append(out, c)
	}
	return out, wrap("list seccomp totals of task "+taskID, rows.Err())
}

// PoolSeccompSyscall is one syscall across a pool's tasks.
type PoolSeccompSyscall struct {
	Syscall string
	Count   int64
	// Tasks is how many tasks made it; TaskIDs up to ten of them, newest
	// first.
	Tasks   int
	TaskIDs []string
}

// PoolSeccomp is what seccomp log mode recorded for a workspace's tasks of
// a pool created since a time.
type PoolSeccomp struct {
	// Observed counts the tasks that ran under log mode at all.
	Observed int
	Syscalls []PoolSeccompSyscall
}

// maxSeccompTaskIDs bounds the task IDs listed per syscall.
const maxSeccompTaskIDs = 10

// PoolSeccomp sums the seccomp log-mode records of a workspace's tasks in
// a pool created at or after since, most frequent syscall first.
func (s *Store) PoolSeccomp(ctx context.Context, workspaceID, pool string, since time.Time) (PoolSeccomp, error) {
	var out PoolSeccomp
	rows, err := s.pool.Query(ctx, `SELECT a.syscall, a.task_id, sum(a.count)::bigint, max(t.created_at)
		FROM attempt_seccomp a JOIN tasks t ON t.id = a.task_id
		WHERE t.workspace_id = $1 AND t.pool = $2 AND t.created_at >= $3
		GROUP BY a.syscall, a.task_id ORDER BY max(t.created_at) DESC, a.task_id`, workspaceID, pool, since)
	if err != nil {
		return out, wrap("pool seccomp report "+pool, err)
	}
	defer rows.Close()
	by := map[string]*PoolSeccompSyscall{}
	for rows.Next() {
		var (
			name, task string
			n          int64
			at         time.Time
		)
		if err := rows.Scan(&name, &task, &n, &at); err != nil {
			return out, wrap("scan pool seccomp report", err)
		}
		if name == "" {
			out.Observed++
			continue
		}
		sc := by[name]
		if sc == nil {
			sc = &PoolSeccompSyscall{Syscall: name}
			by[name] = sc
		}
		sc.Count += n
		sc.Tasks++
		if len(sc.TaskIDs) < maxSeccompTaskIDs {
			sc.TaskIDs = append(sc.TaskIDs, task)
		}
	}
	if err := rows.Err(); err != nil {
		return out, wrap("pool seccomp report "+pool, err)
	}
	for _, sc := range by {
		out.Syscalls = append(out.Syscalls, *sc)
	}
	sort.Slice(out.Syscalls, func(i, j int) bool {
		a, b := out.Syscalls[i], out.Syscalls[j]
		return a.Count > b.Count || (a.Count == b.Count && a.Syscall < b.Syscall)
	})
	return out, nil
}
