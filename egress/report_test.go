package egress

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/clock"
)

func TestReadinessWindow(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	r := NewReadiness(time.Hour, clk)
	r.AddCount("gpu", "task-1", ClassMetadata, 3)
	r.AddSample("gpu", "task-1", ClassMetadata, "169.254.169.254:80/tcp")
	r.AddCount("cpu", "task-9", ClassPrivate, 7)
	clk.Advance(30 * time.Minute)
	r.AddCount("gpu", "task-2", ClassPrivate, 5)
	r.AddSample("gpu", "task-2", ClassPrivate, "10.1.2.3:5432/tcp")
	r.AddSample("gpu", "task-2", ClassPrivate, "10.1.2.3:5432/tcp")

	rep := r.Report("gpu", ModeObserve)
	if rep.Total != 8 || rep.SafeToEnforce {
		t.Fatalf("total = %d safe=%v, want 8, false", rep.Total, rep.SafeToEnforce)
	}
	if rep.ByClass[0] != (ClassCount{ClassPrivate, 5}) || rep.ByClass[1] != (ClassCount{ClassMetadata, 3}) {
		t.Errorf("by class = %+v", rep.ByClass)
	}
	if rep.ByTask[0] != (TaskCount{"task-2", ClassPrivate, 5}) {
		t.Errorf("by task = %+v", rep.ByTask)
	}
	if rep.Destinations[0] != (DestinationSample{ClassPrivate, "10.1.2.3:5432/tcp", "task-2", 2}) {
		t.Errorf("destinations = %+v", rep.Destinations)
	}
	txt := rep.Text()
	for _, want := range []string{"pool gpu (mode observe)", "8 connection attempts", "10.1.2.3:5432/tcp", "task-1"} {
		if !strings.Contains(txt, want) {
			t.Errorf("text lacks %q:\n%s", want, txt)
		}
	}
	if strings.Contains(txt, "task-9") {
		t.Errorf("other pool in report:\n%s", txt)
	}
	js, err := rep.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil || back.Total != 8 || len(back.Destinations) != 2 {
		t.Errorf("json round trip: %v %+v", err, back)
	}

	// The first minute falls out of the window.
	clk.Advance(45 * time.Minute)
	if rep := r.Report("gpu", ModeObserve); rep.Total != 5 || len(rep.Destinations) != 1 {
		t.Errorf("after 75m: total = %d dests = %+v, want 5 and one", rep.Total, rep.Destinations)
	}
	clk.Advance(2 * time.Hour)
	r.AddCount("gpu", "x", ClassDNS, 0) // zero counts record nothing
	if rep := r.Report("gpu", ModeObserve); !rep.SafeToEnforce || !strings.Contains(rep.Text(), "enforce is safe") {
		t.Errorf("empty window not safe: %+v", rep)
	}
}
