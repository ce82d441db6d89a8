package tasks

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// appliedJSON encodes the security an attempt's runtime really applied,
// as its agent reported it with the RUNNING update, for the store (nil
// from an agent that does not report it: nothing is stored, nothing
// claimed). The first report wins; a resent RUNNING record changes nothing.
func appliedJSON(a *v1.AppliedSecurity) ([]byte, error) {
	if a == nil {
		return nil, nil
	}
	b, err := protojson.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("applied security: %w", err)
	}
	return b, nil
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
