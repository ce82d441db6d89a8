package enroll

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Floor is a machine's local security minimum: the loosest container
// security its agent accepts from the controlplane. An empty field is no
// floor for that setting (the lowest level). Each setting is ordered:
//
//	profile  legacy < hardened
//	seccomp  off < log < enforce
//	egress   observe < enforce
//
// The operator sets it on the machine (`levers9-agent run --min-*`, or
// `levers9 machine create --min-*`, which writes it into the join script);
// the controlplane never sends it, so a controlplane cannot lower it.
type Floor struct {
	Profile string `json:"profile,omitempty"`
	Seccomp string `json:"seccomp,omitempty"`
	Egress  string `json:"egress,omitempty"`
}

// The levels of each setting, loosest first.
var (
	ProfileLevels = []string{"legacy", "hardened"}
	SeccompLevels = []string{"off", "log", "enforce"}
	EgressLevels  = []string{"observe", "enforce"}
)

// floorSetting is one setting of a Floor: its flag, its levels, its value.
type floorSetting struct {
	flag   string
	levels []string
	value  string
}

func (f Floor) settings() []floorSetting {
	return []floorSetting{{"--min-profile", ProfileLevels, f.Profile},
		{"--min-seccomp", SeccompLevels, f.Seccomp}, {"--min-egress", EgressLevels, f.Egress}}
}

// Validate reports every unknown level at once, each naming its flag.
func (f Floor) Validate() error {
	var errs []error
	for _, s := range f.settings() {
		if s.value != "" && !slices.Contains(s.levels, s.value) {
			errs = append(errs, fmt.Errorf("%s: %q is not one of %s", s.flag, s.value, strings.Join(s.levels, ", ")))
		}
	}
	return errors.Join(errs...)
}

// IsZero reports whether the floor sets nothing.
func (f Floor) IsZero() bool { return f == Floor{} }

// Args are the `levers9-agent run` flags that set this floor.
func (f Floor) Args() []string {
	var out []string
	for _, s := range f.settings() {
		if s.value != "" {
			out = append(out, s.flag+"="+s.value)
		}
	}
	return out
}

// String is the floor for humans: "profile=hardened seccomp=enforce", or
// "none".
func (f Floor) String() string {
	var out []string
	for _, s := range f.settings() {
		if s.value != "" {
			out = append(out, strings.TrimPrefix(s.flag, "--min-")+"="+s.value)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, " ")
}

// Below lists each setting of (profile, seccomp, egress) that is looser
// than the floor, or unknown while the floor sets one, as "profile
// \"legacy\" is below this machine's floor \"hardened\"". Empty: the
// settings meet the floor.
func (f Floor) Below(profile, seccomp, egress string) []string {
	var out []string
	for i, s := range f.settings() {
		if s.value == "" {
			continue
		}
		got := [3]string{profile, seccomp, egress}[i]
		name := strings.TrimPrefix(s.flag, "--min-")
		if slices.Index(s.levels, got) < slices.Index(s.levels, s.value) {
			out = append(out, fmt.Sprintf("%s %q is below this machine's floor %q (%s)", name, got, s.value, s.flag))
		}
	}
	return out
}

// floorLine is the join script's line that carries the floor.
var floorLine = regexp.MustCompile(`(?m)^AGENT_FLOOR='[^'\n]*'$`)

// SetScriptFloor writes the floor into a join script from JoinScript: the
// agent it starts runs with these --min-* flags. The operator's CLI does
// this after the controlplane rendered the script, so the floor never
// depends on the controlplane.
func SetScriptFloor(script string, f Floor) (string, error) {
	if err := f.Validate(); err != nil {
		return "", err
	}
	if len(floorLine.FindAllStringIndex(script, -1)) != 1 {
		return "", errors.New("the join script has no AGENT_FLOOR line (a controlplane older than the CLI?): pass the --min-* flags after -- when running the script instead")
	}
	args := strings.Join(f.Args(), " ")
	if args != "" {
		args = " " + args
	}
	return floorLine.ReplaceAllLiteralString(script, "AGENT_FLOOR='"+args+"'"), nil
}
