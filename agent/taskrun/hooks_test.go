package taskrun

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

// phaseHook records the phases the Runner calls, and can fail Prestart.
type phaseHook struct {
	name string
	fail bool
	// onPoststart, when set, is called from Poststart (to kill the task).
	onPoststart func()

	// mu guards calls.
	mu    *sync.Mutex
	calls *[]string
}

func (h *phaseHook) Name() string { return h.name }

func (h *phaseHook) note(phase string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.calls = append(*h.calls, h.name+"."+phase)
}

func (h *phaseHook) Prestart(ctx context.Context, req *PrestartRequest, resp *PrestartResponse) error {
	h.note("prestart")
	if req.Image == nil {
		return errors.New("ran before the image hook")
	}
	if h.fail {
		return errors.New("injected failure")
	}
	return nil
}

func (h *phaseHook) Poststart(ctx context.Context, req *PoststartRequest) error {
	h.note("poststart")
	if h.onPoststart != nil {
		h.onPoststart()
	}
	return nil
}

func (h *phaseHook) Prekill(ctx context.Context, req *PrekillRequest) error {
	h.note("prekill." + string(req.Reason))
	return nil
}

func (h *phaseHook) Exited(ctx context.Context, req *ExitedRequest, resp *ExitedResponse) error {
	h.note("exited")
	return nil
}

func (h *phaseHook) Stop(ctx context.Context, req *StopRequest) error {
	h.note("stop")
	return nil
}

// TestHookPhases: extra hooks see every phase in order, Stop in reverse
// order; a failing Prestart fails the attempt and still stops every hook.
func TestHookPhases(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	failB := false
	var kill func()
	b := setup(t, setupOpts{cfg: func(c *Config) {
		c.Hooks = func(Task) []Hook {
			return []Hook{&phaseHook{name: "a", mu: &mu, calls: &calls, onPoststart: kill},
				&phaseHook{name: "b", fail: failB, mu: &mu, calls: &calls}}
		}
	}})
	for _, tc := range []struct {
		name      string
		fail      bool
		kill      bool
		wantState State
		want      []string
	}{
		{"all phases", false, false, StateSucceeded, []string{"a.prestart", "b.prestart", "a.poststart", "b.poststart", "a.exited", "b.exited", "b.stop", "a.stop"}},
		{"prestart fails", true, false, StateFailed, []string{"a.prestart", "b.prestart", "b.stop", "a.stop"}},
		{"killed", false, true, StateCancelled, []string{"a.prestart", "b.prestart", "a.poststart", "b.poststart",
			"a.prekill.CANCELLED", "b.prekill.CANCELLED", "a.exited", "b.exited", "b.stop", "a.stop"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			mu.Lock()
			calls, failB, kill = nil, tc.fail, nil
			if tc.kill {
				kill = cancel
			}
			mu.Unlock()
			tk := b.task("hooks", "exec sleep 0.2")
			res, err := b.runner.Run(ctx, tk, Output{})
			if res.State != tc.wantState || (err != nil) != tc.fail {
				t.Fatalf("Run = %s, %v", res.State, err)
			}
			if tc.fail && !contains(err.Error(), "prestart b: injected failure") {
				t.Errorf("error %v does not name the hook", err)
			}
			mu.Lock()
			got := slices.Clone(calls)
			mu.Unlock()
			if !slices.Equal(got, tc.want) {
				t.Errorf("phases %v, want %v", got, tc.want)
			}
			b.assertClean(t, tk)
		})
	}
}
