package taskrun

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
)

func TestReasons(t *testing.T) {
	t.Parallel()
	notFound := fmt.Errorf("pull image r/x:1: manifest: MANIFEST_UNKNOWN: %w", errdefs.ErrNotFound)
	tests := []struct {
		name    string
		err     error
		reason  Reason
		summary string
	}{
		{"missing image", pullReason("r/x:1", "r", notFound), ReasonImageNotFound, "image r/x:1 was not found (check the name and tag)"},
		{"registry down", pullReason("r/x:1", "r", errors.New("dial tcp: refused")), ReasonImagePullFailed, "image r/x:1 could not be pulled"},
		{"registry refused", pullReason("r/x:1", "r", fmt.Errorf("pull: %w: %w", image.ErrAccessRefused, errdefs.ErrUnauthenticated)), ReasonImagePullFailed,
			"registry r refused access to image r/x:1 (log in with levers9 registry login r)"},
		{"runtime", startReason(fmt.Errorf("start container: %w", errors.New("runsc run failed (exit 128): cannot run with network enabled"))),
			ReasonStartFailed, "the container runtime could not start it: runsc run failed (exit 128): cannot run with network enabled"},
		{"kept through wrapping", fmt.Errorf("task t attempt 1: %w", startReason(withReason(ReasonNetworkFailed, "net", errors.New("x")))),
			ReasonNetworkFailed, "net"},
		{"none", errors.New("plain"), ReasonNone, ""},
	}
	for _, tt := range tests {
		r, s := ReasonOf(tt.err)
		if r != tt.reason || !strings.HasPrefix(s, tt.summary) || (tt.summary == "") != (s == "") {
			t.Errorf("%s: %q %q, want %q %q", tt.name, r, s, tt.reason, tt.summary)
		}
	}
	limits := []struct {
		k       sandbox.LimitKills
		res     sandbox.Resources
		reason  Reason
		summary string
	}{
		{sandbox.LimitKills{OOMKills: 1}, sandbox.Resources{MemoryBytes: 64 << 20}, ReasonOutOfMemory, "out of memory: limit 64 MiB"},
		{sandbox.LimitKills{OOMKills: 2}, sandbox.Resources{MemoryBytes: 1536 << 20}, ReasonOutOfMemory, "out of memory: limit 1536 MiB"},
		{sandbox.LimitKills{PidsMax: 3}, sandbox.Resources{Pids: 100}, ReasonPidsLimit, "process limit reached: limit 100"},
		{sandbox.LimitKills{}, sandbox.Resources{MemoryBytes: 1 << 30}, ReasonNone, ""},
	}
	for _, tt := range limits {
		if r, s := limitReason(tt.k, tt.res); r != tt.reason || s != tt.summary {
			t.Errorf("limitReason(%+v, %+v) = %q %q, want %q %q", tt.k, tt.res, r, s, tt.reason, tt.summary)
		}
	}
}
