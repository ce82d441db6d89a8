package testenv

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// the goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

func TestEventually(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		trueFrom int32 // cond is true from this call on; 0 never
		wantFail bool
	}{
		{name: "true at once", trueFrom: 1},
		{name: "true after a few polls", trueFrom: 4},
		{name: "never true", wantFail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			cond := func() bool { return tc.trueFrom > 0 && calls.Add(1) >= tc.trueFrom }
			rec := &fatalRecorder{TB: t}
			failed := func() (failed bool) {
				defer func() {
					if r := recover(); r != nil {
						if r != rec {
							panic(r)
						}
						failed = true
					}
				}()
				Eventually(rec, 50*time.Millisecond, "the thing", cond)
				return false
			}()
			if failed != tc.wantFail {
				t.Fatalf("failed = %v (%q), want %v", failed, rec.msg, tc.wantFail)
			}
			if failed && !strings.Contains(rec.msg, "the thing") {
				t.Errorf("message %q does not name what it waited for", rec.msg)
			}
			if !failed && calls.Load() != tc.trueFrom {
				t.Errorf("cond called %d times, want %d", calls.Load(), tc.trueFrom)
			}
		})
	}
}
