package store_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// TestMarkRunningStoresAppliedSecurity: the first report is kept, a repeat
// changes nothing, the value comes back with the attempt, and only a JSON
// object is taken (a refused one leaves the attempt as it was).
func TestMarkRunningStoresAppliedSecurity(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	tk := newTask(t, b.st, b.ws.ID, "default", nil)
	a := b.place(t, tk.ID)
	if _, atts := b.task(t, tk.ID); atts[0].AppliedSecurity != nil {
		t.Fatalf("before any report: %s", atts[0].AppliedSecurity)
	}
	first := []byte(`{"runtime":"runc","seccompMode":"enforce"}`)
	for i, tc := range []struct {
		n       int
		applied []byte
		changed bool
		err     error
	}{
		{a.Number, []byte(`not json`), false, errdefs.ErrInvalidArgument},
		{a.Number, []byte(`["a"]`), false, errdefs.ErrInvalidArgument},
		{a.Number + 1, first, false, nil},
		{a.Number, first, true, nil},
		// A resent RUNNING record keeps the first value.
		{a.Number, []byte(`{"runtime":"runsc"}`), false, nil},
		{a.Number, nil, false, nil},
	} {
		changed, err := b.st.MarkRunning(b.ctx, tk.ID, tc.n, time.Now(), tc.applied)
		if changed != tc.changed || (tc.err == nil) != (err == nil) || (tc.err != nil && !errors.Is(err, tc.err)) {
			t.Errorf("#%d MarkRunning(attempt %d, %s) = %v, %v; want %v, %v", i, tc.n, tc.applied, changed, err, tc.changed, tc.err)
		}
	}
	_, atts := b.task(t, tk.ID)
	var got map[string]any
	if err := json.Unmarshal(atts[0].AppliedSecurity, &got); err != nil || got["runtime"] != "runc" || got["seccompMode"] != "enforce" {
		t.Errorf("stored %s (%v)", atts[0].AppliedSecurity, err)
	}
	if atts[0].State != store.AttemptRunning {
		t.Errorf("attempt state %s, want RUNNING", atts[0].State)
	}
}
