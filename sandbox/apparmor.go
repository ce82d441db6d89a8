package sandbox

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"os/exec"
	"slices"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// AppArmorProfileText is the levers9-default profile (apparmor/levers9-default):
// Docker's docker-default under levers9's name.
//
//go:embed apparmor/levers9-default
var AppArmorProfileText []byte

// LoadAppArmor loads the levers9-default profile with apparmor_parser (parser
// is its path; "" finds it on PATH) where the node has AppArmor enabled and
// the profile is not loaded yet, and returns host with the profile listed.
// On a node without AppArmor it does nothing: containers then get no
// profile and report AppArmorNotLoaded. A profile other than the default is
// the operator's to load.
//
// Untested here: the kernels this repository's tests run on have no
// AppArmor, so only the skip is exercised.
func LoadAppArmor(ctx context.Context, host Host, parser string) (Host, error) {
	if !host.AppArmorEnabled || slices.Contains(host.AppArmorProfiles, AppArmorProfileName) {
		return host, nil
	}
	if parser == "" {
		parser = "apparmor_parser"
	}
	p, err := exec.LookPath(parser)
	if err != nil {
		return host, errdefs.WithRetry(fmt.Errorf("load AppArmor profile %s: %w: %w", AppArmorProfileName, err, errdefs.ErrFailedPrecondition), false)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// -r replaces a stale copy; -W writes the kernel's cache so a reboot
	// does not need the parser again.
	cmd := exec.CommandContext(ctx, p, "-r", "-W")
	cmd.Stdin = bytes.NewReader(AppArmorProfileText)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return host, errdefs.WithRetry(fmt.Errorf("load AppArmor profile %s: %s: %w (output %q)", AppArmorProfileName, p, err, truncateOutput(out.String())), false)
	}
	host.AppArmorProfiles = append(slices.Clone(host.AppArmorProfiles), AppArmorProfileName)
	return host, nil
}

func truncateOutput(s string) string {
	if len(s) > 500 {
		return s[:500] + "..."
	}
	return s
}
