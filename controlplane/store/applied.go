package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/levers9/levers9/internal/errdefs"
)

// SetAppliedSecurity stores the security an attempt's runtime really
// applied (a JSON object the caller encodes), once: a repeated report
// leaves the first value. It reports whether the row changed; an attempt
// that does not exist changes nothing.
func (s *Store) SetAppliedSecurity(ctx context.Context, taskID string, n int, applied []byte) (bool, error) {
	if !json.Valid(applied) || len(applied) == 0 || applied[0] != '{' {
		return false, fmt.Errorf("applied security of attempt %s/%d: not a JSON object: %w", taskID, n, errdefs.ErrInvalidArgument)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE task_attempts SET applied_security = $3
		WHERE task_id = $1 AND number = $2 AND applied_security IS NULL`, taskID, n, applied)
	if err != nil {
		return false, wrap("set applied security", err)
	}
	return tag.RowsAffected() > 0, nil
}
