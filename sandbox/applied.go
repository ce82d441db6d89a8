package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The notes an Effective carries where a control is not applied; the
// controlplane stores and shows them as they are.
const (
	// PathsNotApplicableRunsc is why a runsc container lists no masked or
	// read-only paths: gVisor's /proc and /sys are its own, and runsc
	// ignores both lists.
	PathsNotApplicableRunsc = "not applicable under runsc (its /proc and /sys are gVisor's own; maskedPaths and readonlyPaths are ignored)"
	// AppArmorNotLoaded is a runc container without an AppArmor profile
	// because the node has no AppArmor or not the pool's profile.
	AppArmorNotLoaded = "not loaded on this node"
	// AppArmorIgnoredRunsc is a runsc container: runsc ignores the spec's
	// AppArmor profile (the sandbox itself is the boundary).
	AppArmorIgnoredRunsc = "not applied: runsc ignores it"
	// AppArmorNotAsked is a legacy container: the profile asks for none.
	AppArmorNotAsked = "not applied: the legacy profile asks for none"
)

// effectiveOf reads what runtime rt will really enforce from the final
// spec s, never from the settings that asked for it: the bounding
// capabilities, no-new-privileges, the seccomp profile (its mode and the
// sha256 of its JSON as written to the bundle), the masked and read-only
// paths and the AppArmor profile (both ignored by runsc). profile names the
// set of controls that built s; host says whether AppArmor could confine
// the container.
func effectiveOf(s *specs.Spec, rt RuntimeName, profile Profile, host Host) (Effective, error) {
	eff := Effective{Runtime: rt, Profile: profile, Seccomp: SeccompOff}
	if s == nil || s.Process == nil || s.Linux == nil {
		return eff, fmt.Errorf("effective security: spec without process or linux section")
	}
	if c := s.Process.Capabilities; c != nil {
		eff.Capabilities = slices.Clone(c.Bounding)
	}
	if eff.Capabilities == nil {
		eff.Capabilities = []string{}
	}
	eff.DropNetRaw = !slices.Contains(eff.Capabilities, "CAP_NET_RAW")
	eff.NoNewPrivileges = s.Process.NoNewPrivileges
	if sc := s.Linux.Seccomp; sc != nil {
		eff.Seccomp = SeccompEnforce
		if sc.DefaultAction == specs.ActLog {
			eff.Seccomp = SeccompLog
		}
		// writeBundle marshals the whole spec with encoding/json, which
		// writes this value byte for byte as marshalled on its own.
		b, err := json.Marshal(sc)
		if err != nil {
			return eff, fmt.Errorf("effective security: seccomp profile: %w", err)
		}
		sum := sha256.Sum256(b)
		eff.SeccompSHA256 = hex.EncodeToString(sum[:])
	}
	hasPaths := len(s.Linux.MaskedPaths)+len(s.Linux.ReadonlyPaths) > 0
	switch {
	case rt == RuntimeRunsc:
		if hasPaths {
			eff.PathsNote = PathsNotApplicableRunsc
		}
		eff.AppArmorNote = AppArmorIgnoredRunsc
	default:
		eff.Masked = slices.Clone(s.Linux.MaskedPaths)
		eff.Readonly = slices.Clone(s.Linux.ReadonlyPaths)
		eff.MaskedPaths = len(eff.Masked) > 0
		eff.ReadonlyPaths = len(eff.Readonly) > 0
		p := s.Process.ApparmorProfile
		switch {
		case p != "" && host.AppArmorEnabled && slices.Contains(host.AppArmorProfiles, p):
			eff.AppArmorProfile = p
		case profile == ProfileLegacy:
			eff.AppArmorNote = AppArmorNotAsked
		default:
			eff.AppArmorNote = AppArmorNotLoaded
		}
	}
	return eff, nil
}

// Versioner is a Runtime that can name its binary's version. Version may
// run the binary once and must be safe for concurrent use.
type Versioner interface {
	Version(ctx context.Context) (string, error)
}

var _ Versioner = (*OCI)(nil)

// Version implements Versioner: the "<name> version X" line of the
// binary's --version output, read once and kept (the binary is not
// replaced under a running agent; a failed read is tried again next time).
func (r *OCI) Version(ctx context.Context) (string, error) {
	r.mu.Lock()
	v := r.version
	r.mu.Unlock()
	if v != "" {
		return v, nil
	}
	n, err := RuntimeVersion(ctx, r.binary, string(r.name), 10*time.Second)
	if err != nil {
		return "", fmt.Errorf("runtime %s: %w", r.name, err)
	}
	if n == "" {
		return "", fmt.Errorf("runtime %s: %s is not installed", r.name, r.binary)
	}
	v = string(r.name) + " version " + n
	r.mu.Lock()
	r.version = v
	r.mu.Unlock()
	return v, nil
}
