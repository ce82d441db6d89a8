package agent

import (
	"slices"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sandbox"
)

// appliedPB is the security the runtime really applied, as the attempt's
// RUNNING update carries it. It copies sandbox.Effective (read from the
// final spec) and adds nothing: a control without a value there is absent
// here.
func appliedPB(e *sandbox.Effective) *v1.AppliedSecurity {
	if e == nil {
		return nil
	}
	return &v1.AppliedSecurity{
		Runtime:              string(e.Runtime),
		RuntimeVersion:       e.RuntimeVersion,
		Profile:              string(e.Profile),
		SeccompMode:          string(e.Seccomp),
		SeccompProfileSha256: e.SeccompSHA256,
		Capabilities:         slices.Clone(e.Capabilities),
		NetRawDropped:        e.DropNetRaw,
		NoNewPrivileges:      e.NoNewPrivileges,
		MaskedPaths:          slices.Clone(e.Masked),
		ReadonlyPaths:        slices.Clone(e.Readonly),
		PathsNote:            e.PathsNote,
		ApparmorProfile:      e.AppArmorProfile,
		ApparmorNote:         e.AppArmorNote,
		EgressMode:           e.EgressMode,
		Notes:                slices.Clone(e.Notes),
	}
}
