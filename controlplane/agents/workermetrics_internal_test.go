package agents

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/internal/clock"
)

func counterFamily(t *testing.T, name string, values map[string]float64) []byte {
	t.Helper()
	f := &dto.MetricFamily{Name: proto.String(name), Help: proto.String("h"), Type: dto.MetricType_COUNTER.Enum()}
	for task, v := range values {
		f.Metric = append(f.Metric, &dto.Metric{
			Label:   []*dto.LabelPair{{Name: proto.String("task"), Value: proto.String(task)}, {Name: proto.String("pool"), Value: proto.String("spoofed")}},
			Counter: &dto.Counter{Value: proto.Float64(v)},
		})
	}
	b, err := proto.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWorkerMetricsStore: snapshots and deltas build each agent's series,
// labelled machine and pool by the controlplane; a delta against a base it
// does not hold asks for a full one; series over the cap and names that
// are not worker metrics are dropped and logged; an agent's series leave
// after the expiry.
func TestWorkerMetricsStore(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	var logs bytes.Buffer
	w := newWorkerMetrics(clk, slog.New(slog.NewJSONHandler(&logs, nil)), time.Minute, 3)
	reg := prometheus.NewRegistry()
	reg.MustRegister(w)
	const name = "worker_container_egress_matches_total"
	expect := func(want string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), name); err != nil {
			t.Fatal(err)
		}
	}

	resp := w.report("m_a", "default", &agentv1.MetricsReportRequest{Generation: 7, Seq: 1,
		Changed: [][]byte{counterFamily(t, name, map[string]float64{"t1": 2}), counterFamily(t, "controlplane_rpcs_total", map[string]float64{"x": 1})}})
	if resp.AckedSeq != 1 || resp.NeedFull {
		t.Fatalf("full: %v", resp)
	}
	w.report("m_b", "gpu", &agentv1.MetricsReportRequest{Generation: 9, Seq: 1, Changed: [][]byte{counterFamily(t, name, map[string]float64{"t9": 1})}})
	expect(`# HELP worker_container_egress_matches_total h
# TYPE worker_container_egress_matches_total counter
worker_container_egress_matches_total{machine="m_a",pool="default",task="t1"} 2
worker_container_egress_matches_total{machine="m_b",pool="gpu",task="t9"} 1
`)
	if !strings.Contains(logs.String(), "series dropped") {
		t.Errorf("the controlplane_ name was not logged as dropped: %s", logs.String())
	}

	// A delta: t1 moves, t2 is new, against the held base.
	resp = w.report("m_a", "default", &agentv1.MetricsReportRequest{Generation: 7, Seq: 2, BaseSeq: 1,
		Changed: [][]byte{counterFamily(t, name, map[string]float64{"t1": 5, "t2": 1})}})
	if resp.AckedSeq != 2 {
		t.Fatalf("delta: %v", resp)
	}
	// A delta against a base it does not hold (another generation, an old seq).
	for _, req := range []*agentv1.MetricsReportRequest{{Generation: 8, Seq: 3, BaseSeq: 2}, {Generation: 7, Seq: 3, BaseSeq: 1}} {
		if resp := w.report("m_a", "default", req); !resp.NeedFull || resp.AckedSeq != 0 {
			t.Fatalf("delta against %d/%d: %v", req.Generation, req.BaseSeq, resp)
		}
	}
	// t1 removed.
	w.report("m_a", "default", &agentv1.MetricsReportRequest{Generation: 7, Seq: 3, BaseSeq: 2,
		Removed: [][]byte{counterFamily(t, name, map[string]float64{"t1": 0})}})
	expect(`# HELP worker_container_egress_matches_total h
# TYPE worker_container_egress_matches_total counter
worker_container_egress_matches_total{machine="m_a",pool="default",task="t2"} 1
worker_container_egress_matches_total{machine="m_b",pool="gpu",task="t9"} 1
`)

	// The cap (3 per agent): two of m_b's four new series are dropped
	// (logged at most every 10 minutes per agent).
	logs.Reset()
	clk.Advance(11 * time.Minute)
	w.report("m_a", "default", &agentv1.MetricsReportRequest{Generation: 7, Seq: 4, BaseSeq: 3})
	w.report("m_b", "gpu", &agentv1.MetricsReportRequest{Generation: 9, Seq: 2, BaseSeq: 1,
		Changed: [][]byte{counterFamily(t, name, map[string]float64{"u1": 1, "u2": 1, "u3": 1, "u4": 1})}})
	if n := testutil.CollectAndCount(w, name); n != 4 {
		t.Errorf("series after the cap = %d, want 1 of m_a and 3 of m_b", n)
	}
	if !strings.Contains(logs.String(), `"dropped":2`) || !strings.Contains(logs.String(), `"machine_id":"m_b"`) {
		t.Errorf("cap not logged: %s", logs.String())
	}

	// m_a stops reporting: its series leave after the expiry.
	clk.Advance(30 * time.Second)
	w.report("m_b", "gpu", &agentv1.MetricsReportRequest{Generation: 9, Seq: 3, BaseSeq: 2})
	clk.Advance(45 * time.Second)
	if n := testutil.CollectAndCount(w, name); n != 3 {
		t.Errorf("series after m_a's expiry = %d, want m_b's 3", n)
	}
}
