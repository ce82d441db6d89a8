package agent

import (
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// seriesIn lists "family{labels}" of a report's marshalled families.
func seriesIn(t *testing.T, raw [][]byte) []string {
	t.Helper()
	var out []string
	for _, b := range raw {
		var f dto.MetricFamily
		if err := proto.Unmarshal(b, &f); err != nil {
			t.Fatal(err)
		}
		for _, m := range f.GetMetric() {
			s := f.GetName() + "{"
			for _, l := range m.GetLabel() {
				s += l.GetName() + "=" + l.GetValue() + ","
			}
			out = append(out, s+"}")
		}
	}
	sort.Strings(out)
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMetricsSnapshotDelta: the first report is full; once acknowledged,
// a report carries only changed, new and removed series; a lost answer or
// an unacknowledged report keeps the old base; need_full starts over.
func TestMetricsSnapshotDelta(t *testing.T) {
	m := NewMetrics()
	matches := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "worker_container_egress_matches_total", Help: "h"}, []string{"pool", "task", "class"})
	m.Registry.MustRegister(matches)
	matches.WithLabelValues("default", "t1", "metadata").Add(2)
	matches.WithLabelValues("default", "t2", "private").Add(1)
	m.TunnelConnected.WithLabelValues("quic").Set(1)
	snap := newSnapshotter()
	gather := func() []*dto.MetricFamily {
		f, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	send := func(resp func(req *agentv1.MetricsReportRequest) *agentv1.MetricsReportResponse) *agentv1.MetricsReportRequest {
		t.Helper()
		req, err := snap.next(gather())
		if err != nil {
			t.Fatal(err)
		}
		snap.ack(req.Seq, resp(req))
		return req
	}
	ok := func(req *agentv1.MetricsReportRequest) *agentv1.MetricsReportResponse {
		return &agentv1.MetricsReportResponse{AckedSeq: req.Seq}
	}
	lost := func(*agentv1.MetricsReportRequest) *agentv1.MetricsReportResponse { return nil }

	first := send(ok)
	all := seriesIn(t, first.Changed)
	if first.BaseSeq != 0 || first.Seq != 1 || len(all) != 4 || len(first.Removed) != 0 {
		t.Fatalf("first report: base %d seq %d series %v removed %d", first.BaseSeq, first.Seq, all, len(first.Removed))
	}

	// Nothing changed: an empty delta against 1.
	if r := send(ok); r.BaseSeq != 1 || len(r.Changed) != 0 || len(r.Removed) != 0 {
		t.Fatalf("unchanged: base %d changed %v removed %v", r.BaseSeq, seriesIn(t, r.Changed), seriesIn(t, r.Removed))
	}

	// One counter moves, one series is new, one goes.
	matches.WithLabelValues("default", "t1", "metadata").Inc()
	matches.WithLabelValues("default", "t3", "metadata").Inc()
	matches.DeleteLabelValues("default", "t2", "private")
	r := send(lost)
	want := []string{"worker_container_egress_matches_total{class=metadata,pool=default,task=t1,}",
		"worker_container_egress_matches_total{class=metadata,pool=default,task=t3,}"}
	gone := []string{"worker_container_egress_matches_total{class=private,pool=default,task=t2,}"}
	if r.BaseSeq != 2 || !equal(seriesIn(t, r.Changed), want) || !equal(seriesIn(t, r.Removed), gone) {
		t.Fatalf("delta: base %d changed %v removed %v", r.BaseSeq, seriesIn(t, r.Changed), seriesIn(t, r.Removed))
	}
	// Its answer was lost: the next report is against 2 again, with the same delta.
	r = send(ok)
	if r.BaseSeq != 2 || r.Seq != 4 || !equal(seriesIn(t, r.Changed), want) || !equal(seriesIn(t, r.Removed), gone) {
		t.Fatalf("resent delta: base %d seq %d changed %v removed %v", r.BaseSeq, r.Seq, seriesIn(t, r.Changed), seriesIn(t, r.Removed))
	}
	if r := send(ok); r.BaseSeq != 4 || len(r.Changed) != 0 || len(r.Removed) != 0 {
		t.Fatalf("after ack: base %d changed %v", r.BaseSeq, seriesIn(t, r.Changed))
	}

	// The controlplane lost the base (restart, another replica): full again.
	r = send(func(*agentv1.MetricsReportRequest) *agentv1.MetricsReportResponse {
		return &agentv1.MetricsReportResponse{NeedFull: true}
	})
	if r.BaseSeq != 5 {
		t.Fatalf("base %d", r.BaseSeq)
	}
	r = send(ok)
	if r.BaseSeq != 0 || len(seriesIn(t, r.Changed)) != 4 || len(r.Removed) != 0 {
		t.Fatalf("after need_full: base %d series %v", r.BaseSeq, seriesIn(t, r.Changed))
	}
	// An acknowledgement of another report moves nothing.
	req, err := snap.next(gather())
	if err != nil {
		t.Fatal(err)
	}
	snap.ack(req.Seq, &agentv1.MetricsReportResponse{AckedSeq: req.Seq - 1})
	if r := send(ok); r.BaseSeq != 7 {
		t.Fatalf("stale ack moved the base to %d", r.BaseSeq)
	}
}

// TestMetricsIntervalFromTheControlplane: an agent whose own interval is an
// hour sends snapshots at the interval the heartbeat answer names
// (controlplane.metrics.workerInterval), and its series leave the
// controlplane's /metrics workerExpiry after it stops.
func TestMetricsIntervalFromTheControlplane(t *testing.T) {
	t.Parallel()
	b := setupJoinWith(t, func(c *config.Config) {
		c.Controlplane.Metrics.WorkerInterval = "1s"
		c.Controlplane.Metrics.WorkerExpiry = "2s"
	})
	a := startJoinedAgent(t, b, RunOptions{HeartbeatInterval: 300 * time.Millisecond, MetricsInterval: time.Hour})
	scrape := func() string {
		resp, err := http.Get("http://" + b.in.Server.MetricsAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	series := `worker_tunnel_connected{machine="` + a.MachineID() + `",pool="default",transport=`
	controlplanetest.Eventually(t, 15*time.Second, "the agent's tunnel state in the controlplane's scrape", func() bool {
		return strings.Contains(scrape(), series)
	})
	a.Stop()
	controlplanetest.Eventually(t, 15*time.Second, "the stopped agent's series gone", func() bool {
		return !strings.Contains(scrape(), `machine="`+a.MachineID()+`"`)
	})
}
