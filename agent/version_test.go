package agent

import (
	"bytes"
	"context"
	"testing"

	"github.com/levers9/levers9/internal/version"
)

// TestVersionCommand: `levers9-agent version` and `--version` print the
// stamped line, and what the agent reports at enroll and heartbeat is that
// line within enroll's 64-byte limit.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"version", "--version"} {
		var out, errb bytes.Buffer
		if err := Main(context.Background(), []string{arg}, &out, &errb); err != nil {
			t.Fatalf("%s: %v (%s)", arg, err, errb.String())
		}
		if want := "levers9-agent " + version.String() + "\n"; out.String() != want {
			t.Errorf("%s printed %q, want %q", arg, out.String(), want)
		}
	}
	if got := reportedVersion(); got != version.String() || len(got) > 64 {
		t.Errorf("reportedVersion() = %q, want %q within 64 bytes", got, version.String())
	}
}
