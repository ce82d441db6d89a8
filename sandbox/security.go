package sandbox

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
)

// Profile is worker.containerSecurity.profile.
type Profile string

// The profiles. Legacy is what tasks got before hardening existed: Docker's
// capabilities and nothing else.
const (
	ProfileLegacy   Profile = "legacy"
	ProfileHardened Profile = "hardened"
)

// SeccompMode is worker.containerSecurity.seccomp.
type SeccompMode string

// The seccomp modes. Log installs Docker's profile with a default action of
// SCMP_ACT_LOG, so the kernel records what enforce would refuse.
const (
	SeccompOff     SeccompMode = "off"
	SeccompLog     SeccompMode = "log"
	SeccompEnforce SeccompMode = "enforce"
)

// RuntimeName names an OCI runtime binary.
type RuntimeName string

// The runtimes the sandbox drives.
const (
	RuntimeRunc  RuntimeName = "runc"
	RuntimeRunsc RuntimeName = "runsc"
)

// Task environment variables through which a task may tighten its pool's
// settings (never loosen them).
const (
	EnvSecurityProfile = "LEVERS9_SECURITY_PROFILE"
	EnvSeccomp         = "LEVERS9_SECCOMP"
	// EnvVolumeMountValidation may ask for enforce on a pool at log.
	EnvVolumeMountValidation = "LEVERS9_VOLUME_MOUNT_VALIDATION"
)

// Security is a pool's worker.containerSecurity block (after per-pool
// overrides), as the agent receives it.
type Security struct {
	Profile    Profile     `json:"profile"`
	Seccomp    SeccompMode `json:"seccomp"`
	DropNetRaw bool        `json:"dropNetRaw"`
	Runtime    RuntimeName `json:"runtime"`
	// AppArmorProfile is worker.containerSecurity.apparmorProfile: the
	// profile hardened runc containers get where the node has AppArmor
	// and the profile loaded (default AppArmorProfileName).
	AppArmorProfile string `json:"apparmorProfile,omitempty"`
	// NoNewPrivilegesExceptions lists when a hardened container still runs
	// without no-new-privileges. The zero value grants both exceptions the
	// issue names, because docker-in-docker and images built around sudo
	// break without setuid.
	NoNewPrivilegesExceptions NNPExceptions `json:"noNewPrivilegesExceptions"`
	// MountValidation is the pool's worker.volumeMountValidation as the
	// controlplane pushed it; empty keeps the node's (Config.MountValidation).
	// The stricter of the two applies: a pool set to enforce refuses
	// sensitive volume sources on a node left at log.
	MountValidation MountValidation `json:"mountValidation,omitempty"`
}

// NNPExceptions says which containers keep setuid working under the hardened
// profile. The fields are phrased as denials so the zero value keeps the
// documented defaults.
type NNPExceptions struct {
	// DenyDockerInDocker sets no-new-privileges even for tasks that run
	// Docker inside.
	DenyDockerInDocker bool `json:"denyDockerInDocker"`
	// DenyNonRootImageUser sets no-new-privileges even for images whose
	// configured user is not root.
	DenyNonRootImageUser bool `json:"denyNonRootImageUser"`
}

// WithDefaults fills empty fields: profile hardened, seccomp enforce,
// runtime runc. DropNetRaw keeps its value: a bool cannot say "unset", so
// the config layer owns that default.
func (s Security) WithDefaults() Security {
	if s.Profile == "" {
		s.Profile = ProfileHardened
	}
	if s.Seccomp == "" {
		s.Seccomp = SeccompEnforce
	}
	if s.Runtime == "" {
		s.Runtime = RuntimeRunc
	}
	if s.AppArmorProfile == "" {
		s.AppArmorProfile = AppArmorProfileName
	}
	return s
}

// appArmorProfile is the profile to ask for, the default when unset.
func (s Security) appArmorProfile() string {
	if s.AppArmorProfile == "" {
		return AppArmorProfileName
	}
	return s.AppArmorProfile
}

// appArmorNameRe is what an AppArmor profile name may be here: no spaces,
// no path, nothing apparmor_parser or runc would read differently.
var appArmorNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)

// AppArmorNameRule says what ValidAppArmorProfile accepts, for errors.
const AppArmorNameRule = "letters, digits, '.', '_' and '-', at most 100, starting with a letter or digit"

// ValidAppArmorProfile reports whether name may be an apparmorProfile.
func ValidAppArmorProfile(name string) bool { return appArmorNameRe.MatchString(name) }

// Validate reports every bad field at once, each named by its config key.
func (s Security) Validate() error {
	var errs []error
	if _, ok := profileRank[s.Profile]; !ok {
		errs = append(errs, fmt.Errorf("worker.containerSecurity.profile: %q is not legacy or hardened", s.Profile))
	}
	if _, ok := seccompRank[s.Seccomp]; !ok {
		errs = append(errs, fmt.Errorf("worker.containerSecurity.seccomp: %q is not off, log or enforce", s.Seccomp))
	}
	if s.Runtime != RuntimeRunc && s.Runtime != RuntimeRunsc {
		errs = append(errs, fmt.Errorf("worker.containerSecurity.runtime: %q is not runc or runsc", s.Runtime))
	}
	if m := s.MountValidation; m != "" && m != MountValidationLog && m != MountValidationEnforce {
		errs = append(errs, fmt.Errorf("worker.volumeMountValidation: %q is not log or enforce", m))
	}
	if s.AppArmorProfile != "" && !ValidAppArmorProfile(s.AppArmorProfile) {
		errs = append(errs, fmt.Errorf("worker.containerSecurity.apparmorProfile: %q is not a profile name (%s)", s.AppArmorProfile, AppArmorNameRule))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, errors.Join(errs...))
}

var profileRank = map[Profile]int{ProfileLegacy: 0, ProfileHardened: 1}

var seccompRank = map[SeccompMode]int{SeccompOff: 0, SeccompLog: 1, SeccompEnforce: 2}

// mountRank ranks "" (the node's own mode, at least log) with log.
var mountRank = map[MountValidation]int{MountValidationLog: 0, MountValidationEnforce: 1}

// Tighten applies a task's LEVERS9_SECURITY_PROFILE, LEVERS9_SECCOMP and
// LEVERS9_VOLUME_MOUNT_VALIDATION requests to its pool's settings. Asking for the pool's own level is fine;
// asking for anything looser is refused with ErrPermissionDenied, and an
// unknown value with ErrInvalidArgument, each naming the variable.
func Tighten(pool Security, env []string) (Security, error) {
	out := pool
	var errs []error
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		switch k {
		case EnvSecurityProfile:
			want := Profile(v)
			r, known := profileRank[want]
			switch {
			case !known:
				errs = append(errs, fmt.Errorf("env %s: %q is not legacy or hardened: %w", k, v, errdefs.ErrInvalidArgument))
			case r < profileRank[pool.Profile]:
				errs = append(errs, fmt.Errorf("env %s: %q is looser than the pool's %q: %w", k, v, pool.Profile, errdefs.ErrPermissionDenied))
			default:
				out.Profile = want
			}
		case EnvSeccomp:
			want := SeccompMode(v)
			r, known := seccompRank[want]
			switch {
			case !known:
				errs = append(errs, fmt.Errorf("env %s: %q is not off, log or enforce: %w", k, v, errdefs.ErrInvalidArgument))
			case r < seccompRank[pool.Seccomp]:
				errs = append(errs, fmt.Errorf("env %s: %q is looser than the pool's %q: %w", k, v, pool.Seccomp, errdefs.ErrPermissionDenied))
			default:
				out.Seccomp = want
			}
		case EnvVolumeMountValidation:
			want := MountValidation(v)
			r, known := mountRank[want]
			switch {
			case !known:
				errs = append(errs, fmt.Errorf("env %s: %q is not log or enforce: %w", k, v, errdefs.ErrInvalidArgument))
			case r < mountRank[pool.MountValidation]:
				errs = append(errs, fmt.Errorf("env %s: %q is looser than the pool's %q: %w", k, v, pool.MountValidation, errdefs.ErrPermissionDenied))
			case r > mountRank[pool.MountValidation]:
				// Asking for log keeps "" (the node's mode, maybe enforce).
				out.MountValidation = want
			}
		}
	}
	if len(errs) > 0 {
		return pool, errors.Join(errs...)
	}
	return out, nil
}
