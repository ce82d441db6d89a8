package cli

import (
	"fmt"
	"strings"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// printApplied is `task show`'s "Applied security" block: per attempt, the
// controls the runtime really applied, as its agent read them from the
// final OCI spec and the network it attached. A control that was not
// applied says why, never what was asked.
func (a *app) printApplied(t *v1.Task) {
	for _, at := range t.GetAttempts() {
		fmt.Fprintf(a.io.Out, "\nApplied security (attempt %d):", at.GetNumber())
		s := at.GetAppliedSecurity()
		if s == nil {
			fmt.Fprintln(a.io.Out, " not reported (no container started, or its agent does not report it)")
			continue
		}
		fmt.Fprintln(a.io.Out)
		w := newTab(a)
		runtime := s.GetRuntime()
		if v := s.GetRuntimeVersion(); v != "" {
			runtime += " (" + v + ")"
		}
		seccomp := s.GetSeccompMode()
		if h := s.GetSeccompProfileSha256(); h != "" {
			seccomp += " (profile sha256 " + h + ")"
		}
		netRaw := "kept"
		if s.GetNetRawDropped() {
			netRaw = "dropped"
		}
		apparmor := s.GetApparmorProfile()
		if apparmor == "" {
			apparmor = dash(s.GetApparmorNote())
		}
		for _, kv := range [][2]string{
			{"Runtime", dash(runtime)}, {"Profile", dash(s.GetProfile())}, {"Seccomp", dash(seccomp)},
			{"Capabilities", dash(strings.Join(s.GetCapabilities(), ", "))}, {"NET_RAW", netRaw},
			{"No new privileges", yesNo(s.GetNoNewPrivileges())},
			{"Masked paths", pathsText(s.GetMaskedPaths(), s.GetPathsNote())},
			{"Read-only paths", pathsText(s.GetReadonlyPaths(), s.GetPathsNote())},
			{"AppArmor", apparmor}, {"Egress", dash(s.GetEgressMode())},
		} {
			fmt.Fprintf(w, "  %s:\t%s\n", kv[0], kv[1])
		}
		for _, n := range s.GetNotes() {
			fmt.Fprintf(w, "  Note:\t%s\n", n)
		}
		w.Flush()
	}
}

// pathsText lists paths, or says why there are none.
func pathsText(paths []string, note string) string {
	if len(paths) == 0 {
		return dash(note)
	}
	return strings.Join(paths, ", ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
