package sandbox

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoOtherPart keeps sandbox free of the controlplane, the agent
// and the other parts: only internal/ helpers of levers9 may be imported,
// and no libcontainer (runtimes are driven as binaries).
func TestImportsNoOtherPart(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not available")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/levers9/levers9/") &&
			!strings.HasPrefix(p, "github.com/levers9/levers9/internal/") &&
			!strings.HasPrefix(p, "github.com/levers9/levers9/sandbox") {
			t.Errorf("sandbox depends on %s", p)
		}
		if strings.Contains(p, "opencontainers/runc/libcontainer") {
			t.Errorf("sandbox imports %s", p)
		}
	}
}
