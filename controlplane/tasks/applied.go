package tasks

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// storeApplied keeps the security an attempt's runtime really applied, as
// its agent reported it with the RUNNING update (nil from an agent that
// does not report it: nothing is stored, nothing claimed). The first
// report wins; a resent RUNNING record changes nothing.
func (in *intake) storeApplied(ctx context.Context, taskID string, n int, a *v1.AppliedSecurity) error {
	if a == nil {
		return nil
	}
	b, err := protojson.Marshal(a)
	if err != nil {
		return fmt.Errorf("report %s/%d: applied security: %w", taskID, n, err)
	}
	_, err = in.d.store.SetAppliedSecurity(ctx, taskID, n, b)
	return err
}

// appliedPB reads an attempt's stored applied security back; nil when
// none was reported (or the row cannot be read, which is logged by no
// one: the column is only written by storeApplied).
func appliedPB(b []byte) *v1.AppliedSecurity {
	if len(b) == 0 {
		return nil
	}
	a := &v1.AppliedSecurity{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, a); err != nil {
		return nil
	}
	return a
}
