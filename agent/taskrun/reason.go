package taskrun

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image"
)

// Reason says why an attempt failed when its exit code does not: the
// platform could not start the program, or a limit killed it. The
// controlplane's store holds the same closed set.
type Reason string

// The reasons; "" is none.
const (
	ReasonNone            Reason = ""
	ReasonStartFailed     Reason = "start_failed"
	ReasonImageNotFound   Reason = "image_not_found"
	ReasonImagePullFailed Reason = "image_pull_failed"
	ReasonMountFailed     Reason = "mount_failed"
	ReasonNetworkFailed   Reason = "network_failed"
	ReasonOutOfMemory     Reason = "out_of_memory"
	ReasonPidsLimit       Reason = "pids_limit"
)

// reasonError marks an error with its reason and the one sentence people
// see; Error keeps the full chain.
type reasonError struct {
	reason  Reason
	summary string
	err     error
}

func (e *reasonError) Error() string { return e.err.Error() }
func (e *reasonError) Unwrap() error { return e.err }

func withReason(r Reason, summary string, err error) error {
	return &reasonError{reason: r, summary: summary, err: err}
}

// ReasonOf returns the reason and summary an error was marked with, or
// ReasonNone.
func ReasonOf(err error) (Reason, string) {
	var re *reasonError
	if errors.As(err, &re) {
		return re.reason, re.summary
	}
	return ReasonNone, ""
}

// pullReason marks an image pull's failure; registry is the host ref
// pulls from.
func pullReason(ref, registry string, err error) error {
	if errors.Is(err, image.ErrAccessRefused) && registry != "" {
		return withReason(ReasonImagePullFailed, fmt.Sprintf("registry %s refused access to image %s (log in with levers9 registry login %s)",
			registry, ref, registry), err)
	}
	if errdefs.IsNotFound(err) {
		return withReason(ReasonImageNotFound, fmt.Sprintf("image %s was not found (check the name and tag)", ref), err)
	}
	return withReason(ReasonImagePullFailed, fmt.Sprintf("image %s could not be pulled (check the registry is up and this machine may read it)", ref), err)
}

// startReason marks the runtime's failure to start a container, with the
// runtime's own message (the innermost error).
func startReason(err error) error {
	if r, _ := ReasonOf(err); r != ReasonNone {
		return err
	}
	inner := err
	for {
		if _, ok := inner.(*fs.PathError); ok {
			// Its Errno alone would not name the path.
			break
		}
		next := errors.Unwrap(inner)
		if next == nil {
			break
		}
		inner = next
	}
	msg := strings.TrimSpace(inner.Error())
	if len(msg) > 300 {
		msg = msg[len(msg)-300:]
	}
	return withReason(ReasonStartFailed, "the container runtime could not start it: "+msg, err)
}

// limitReason is why a container that exited was killed, from its
// cgroup's counters.
func limitReason(k sandbox.LimitKills, res sandbox.Resources) (Reason, string) {
	switch {
	case k.OOMKills > 0 && res.MemoryBytes > 0:
		return ReasonOutOfMemory, "out of memory: limit " + bytesText(res.MemoryBytes)
	case k.OOMKills > 0:
		return ReasonOutOfMemory, "out of memory"
	case k.PidsMax > 0 && res.Pids > 0:
		return ReasonPidsLimit, fmt.Sprintf("process limit reached: limit %d", res.Pids)
	case k.PidsMax > 0:
		return ReasonPidsLimit, "process limit reached"
	}
	return ReasonNone, ""
}

// bytesText is n in the largest binary unit that divides it (64 MiB).
func bytesText(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for i < len(units)-1 && n >= 1024 && n%1024 == 0 {
		n /= 1024
		i++
	}
	return fmt.Sprintf("%d %s", n, units[i])
}
