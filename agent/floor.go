package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/levers9/levers9/agent/taskrun"
	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
)

// floorFile, in the state directory, keeps the machine's floor, so an
// agent started again without --min-* flags enforces the one it was given.
const floorFile = "floor.json"

// resolveFloor returns the floor this agent enforces: each setting given
// (a --min-* flag) wins, the others come from the state directory. The
// result is saved there when it differs. Lowering a setting takes its
// lowest level given explicitly (--min-profile=legacy).
func (s State) resolveFloor(given enroll.Floor) (enroll.Floor, error) {
	if err := given.Validate(); err != nil {
		return enroll.Floor{}, fmt.Errorf("agent floor: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	var saved enroll.Floor
	b, err := os.ReadFile(s.path(floorFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return enroll.Floor{}, err
	default:
		if err := json.Unmarshal(b, &saved); err != nil {
			return enroll.Floor{}, fmt.Errorf("%s does not parse: %w", s.path(floorFile), err)
		}
		if err := saved.Validate(); err != nil {
			return enroll.Floor{}, fmt.Errorf("%s: %w", s.path(floorFile), err)
		}
	}
	f := saved
	for _, p := range []struct{ given, out *string }{{&given.Profile, &f.Profile}, {&given.Seccomp, &f.Seccomp}, {&given.Egress, &f.Egress}} {
		if *p.given != "" {
			*p.out = *p.given
		}
	}
	if f == saved {
		return f, nil
	}
	if b, err = json.Marshal(f); err != nil {
		return enroll.Floor{}, err
	}
	if err := enroll.WriteSecretFile(s.path(floorFile), b); err != nil {
		return enroll.Floor{}, fmt.Errorf("save the agent floor: %w", err)
	}
	return f, nil
}

// nodeEgressMode is the egress mode of an attempt that names none: the
// node's own, which BuildNode leaves at egress's default.
var nodeEgressMode = egress.Config{}.WithDefaults().Security.Egress.Mode

// checkFloor refuses (FailedPrecondition) a task whose effective security
// (its pool's settings after the task's own tightening, as the sandbox
// will apply them) is looser than the floor, naming each setting, the
// pushed value and the floor.
func checkFloor(f enroll.Floor, t taskrun.Task) error {
	if f.IsZero() {
		return nil
	}
	// Tighten returns the pool's settings when the task's request is bad;
	// the sandbox refuses that task anyway.
	eff, _ := sandbox.Tighten(t.Security, t.Env)
	mode := nodeEgressMode
	if t.Network != nil {
		mode = t.Network.Egress.Mode
	}
	below := f.Below(string(eff.Profile), string(eff.Seccomp), string(mode))
	if len(below) == 0 {
		return nil
	}
	return fmt.Errorf("run task %s attempt %d: refused: %s: %w", t.ID, t.Attempt, strings.Join(below, "; "), errdefs.ErrFailedPrecondition)
}
