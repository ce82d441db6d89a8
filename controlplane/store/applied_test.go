package store_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// TestSetAppliedSecurity: the first report is kept, a repeat changes
// nothing, the value comes back with the attempt, and only a JSON object
// is taken.
func TestSetAppliedSecurity(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	tk := newTask(t, b.st, b.ws.ID, "default", nil)
	a := b.place(t, tk.ID)
	if _, atts := b.task(t, tk.ID); atts[0].AppliedSecurity != nil {
		t.Fatalf("before any report: %s", atts[0].AppliedSecurity)
	}
	if _, err := b.st.MarkRunning(b.ctx, tk.ID, a.Number, time.Now()); err != nil {
		t.Fatal(err)
	}
	first := []byte(`{"runtime":"runc","seccompMode":"enforce"}`)
	for i, tc := range []struct {
		n       int
		applied []byte
		want    bool
		err     error
	}{
		{a.Number, []byte(`not json`), false, errdefs.ErrInvalidArgument},
		{a.Number, []byte(`["a"]`), false, errdefs.ErrInvalidArgument},
		{a.Number + 1, first, false, nil},
		{a.Number, first, true, nil},
		{a.Number, []byte(`{"runtime":"runsc"}`), false, nil},
	} {
		changed, err := b.st.SetAppliedSecurity(b.ctx, tk.ID, tc.n, tc.applied)
		if changed != tc.want || (tc.err == nil) != (err == nil) || (tc.err != nil && !errors.Is(err, tc.err)) {
			t.Errorf("#%d SetAppliedSecurity(attempt %d, %s) = %v, %v; want %v, %v", i, tc.n, tc.applied, changed, err, tc.want, tc.err)
		}
	}
	_, atts := b.task(t, tk.ID)
	var got map[string]any
	if err := json.Unmarshal(atts[0].AppliedSecurity, &got); err != nil || got["runtime"] != "runc" || got["seccompMode"] != "enforce" {
		t.Errorf("stored %s (%v)", atts[0].AppliedSecurity, err)
	}
}
