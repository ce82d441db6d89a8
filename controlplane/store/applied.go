package store

import (
	"encoding/json"
	"fmt"

	"github.com/levers9/levers9/internal/errdefs"
)

// checkApplied refuses applied security that is not a JSON object.
func checkApplied(applied []byte) error {
	if !json.Valid(applied) || len(applied) == 0 || applied[0] != '{' {
		return fmt.Errorf("applied security: not a JSON object: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}
