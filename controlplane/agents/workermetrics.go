package agents

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/internal/clock"
)

// workerMetricPrefixes are the metric names agents may report; anything
// else is dropped, so an agent can never shadow the controlplane's own.
var workerMetricPrefixes = []string{"worker_", "levers9_image_", "levers9_sandbox_"}

// workerMetrics holds the latest metrics snapshot of each agent that
// reported to this replica and serves them as a prometheus.Collector,
// each series labelled machine and pool (the controlplane's view; an
// agent's own labels of those names are replaced). An agent's series
// leave expiry after its last report. Series per agent are capped at
// maxSeries: new ones over the cap are dropped and logged. All methods are
// safe for concurrent use.
type workerMetrics struct {
	clock     clock.Clock
	log       *slog.Logger
	expiry    time.Duration
	maxSeries int

	// mu guards agents.
	mu     sync.Mutex
	agents map[string]*agentSnapshot // by machine
}

type agentSnapshot struct {
	pool     string
	gen, seq uint64
	seen     time.Time
	series   map[string]*workerSeries // by series key
	// droppedLogged is when the cap was last logged.
	droppedLogged time.Time
}

type workerSeries struct {
	family string
	help   string
	typ    dto.MetricType
	m      *dto.Metric // labels sorted, machine and pool included
}

func newWorkerMetrics(clk clock.Clock, log *slog.Logger, expiry time.Duration, maxSeries int) *workerMetrics {
	if expiry <= 0 {
		expiry = time.Minute
	}
	if maxSeries <= 0 {
		maxSeries = 2000
	}
	return &workerMetrics{clock: clock.OrReal(clk), log: log, expiry: expiry, maxSeries: maxSeries, agents: map[string]*agentSnapshot{}}
}

// report applies one snapshot of machine (in pool) and answers it.
func (w *workerMetrics) report(machine, pool string, req *agentv1.MetricsReportRequest) *agentv1.MetricsReportResponse {
	changed, err := decodeFamilies(req.GetChanged())
	if err != nil {
		w.log.Warn("worker metrics snapshot refused", "machine_id", machine, "err", err)
		return &agentv1.MetricsReportResponse{NeedFull: true}
	}
	removed, err := decodeFamilies(req.GetRemoved())
	if err != nil {
		w.log.Warn("worker metrics snapshot refused", "machine_id", machine, "err", err)
		return &agentv1.MetricsReportResponse{NeedFull: true}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	a := w.agents[machine]
	if req.GetBaseSeq() == 0 {
		a = &agentSnapshot{series: map[string]*workerSeries{}}
		if old := w.agents[machine]; old != nil {
			a.droppedLogged = old.droppedLogged
		}
		w.agents[machine] = a
	} else if a == nil || a.gen != req.GetGeneration() || a.seq != req.GetBaseSeq() {
		return &agentv1.MetricsReportResponse{NeedFull: true}
	}
	a.pool, a.gen, a.seq, a.seen = pool, req.GetGeneration(), req.GetSeq(), w.clock.Now()
	for _, f := range removed {
		for _, m := range f.GetMetric() {
			delete(a.series, workerSeriesKey(f.GetName(), m.GetLabel()))
		}
	}
	dropped := 0
	for _, f := range changed {
		for _, m := range f.GetMetric() {
			s, ok := newWorkerSeries(f, m, machine, pool)
			if !ok {
				dropped++
				continue
			}
			k := workerSeriesKey(f.GetName(), m.GetLabel())
			if _, had := a.series[k]; !had && len(a.series) >= w.maxSeries {
				dropped++
				continue
			}
			a.series[k] = s
		}
	}
	if dropped > 0 && w.clock.Since(a.droppedLogged) > 10*time.Minute {
		a.droppedLogged = w.clock.Now()
		w.log.Warn("worker metrics: series dropped (over controlplane.metrics.workerMaxSeries, or not a valid worker metric)",
			"machine_id", machine, "pool", pool, "dropped", dropped, "kept", len(a.series), "max", w.maxSeries)
	}
	return &agentv1.MetricsReportResponse{AckedSeq: req.GetSeq()}
}

func decodeFamilies(raw [][]byte) ([]*dto.MetricFamily, error) {
	out := make([]*dto.MetricFamily, 0, len(raw))
	for i, b := range raw {
		var f dto.MetricFamily
		if err := proto.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("family %d: %w", i, err)
		}
		out = append(out, &f)
	}
	return out, nil
}

// workerSeriesKey names a series by family and the agent's labels.
func workerSeriesKey(family string, labels []*dto.LabelPair) string {
	pairs := make([]string, 0, len(labels))
	for _, l := range labels {
		pairs = append(pairs, l.GetName()+"="+l.GetValue())
	}
	sort.Strings(pairs)
	return family + "\xff" + strings.Join(pairs, "\xff")
}

// newWorkerSeries checks one reported series (a worker metric name, valid
// labels, one value of the family's type) and labels it machine and pool.
func newWorkerSeries(f *dto.MetricFamily, m *dto.Metric, machine, pool string) (*workerSeries, bool) {
	name := f.GetName()
	if !model.LegacyValidation.IsValidMetricName(name) || !hasWorkerPrefix(name) || !utf8.ValidString(f.GetHelp()) {
		return nil, false
	}
	out := &dto.Metric{}
	seen := map[string]bool{"machine": true, "pool": true}
	for _, l := range m.GetLabel() {
		n := l.GetName()
		if n == "machine" || n == "pool" {
			continue
		}
		if seen[n] || !model.LegacyValidation.IsValidLabelName(n) || strings.HasPrefix(n, "__") || !utf8.ValidString(l.GetValue()) {
			return nil, false
		}
		seen[n] = true
		out.Label = append(out.Label, &dto.LabelPair{Name: proto.String(n), Value: proto.String(l.GetValue())})
	}
	out.Label = append(out.Label, &dto.LabelPair{Name: proto.String("machine"), Value: proto.String(machine)},
		&dto.LabelPair{Name: proto.String("pool"), Value: proto.String(pool)})
	sort.Slice(out.Label, func(i, j int) bool { return out.Label[i].GetName() < out.Label[j].GetName() })
	switch t := f.GetType(); {
	case t == dto.MetricType_COUNTER && m.Counter != nil:
		out.Counter = &dto.Counter{Value: proto.Float64(m.Counter.GetValue())}
	case t == dto.MetricType_GAUGE && m.Gauge != nil:
		out.Gauge = &dto.Gauge{Value: proto.Float64(m.Gauge.GetValue())}
	case t == dto.MetricType_UNTYPED && m.Untyped != nil:
		out.Untyped = &dto.Untyped{Value: proto.Float64(m.Untyped.GetValue())}
	case t == dto.MetricType_HISTOGRAM && m.Histogram != nil && len(m.Histogram.GetPositiveSpan()) == 0 && len(m.Histogram.GetNegativeSpan()) == 0:
		h := &dto.Histogram{SampleCount: proto.Uint64(m.Histogram.GetSampleCount()), SampleSum: proto.Float64(m.Histogram.GetSampleSum())}
		for _, b := range m.Histogram.GetBucket() {
			h.Bucket = append(h.Bucket, &dto.Bucket{UpperBound: proto.Float64(b.GetUpperBound()), CumulativeCount: proto.Uint64(b.GetCumulativeCount())})
		}
		out.Histogram = h
	default:
		return nil, false
	}
	return &workerSeries{family: name, help: f.GetHelp(), typ: f.GetType(), m: out}, true
}

func hasWorkerPrefix(name string) bool {
	for _, p := range workerMetricPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Describe sends nothing: the series come and go with the agents (an
// unchecked collector).
func (w *workerMetrics) Describe(chan<- *prometheus.Desc) {}

// Collect drops the agents whose last report is older than the expiry and
// sends every other agent's series. Per family, the help and type of the
// first agent (by machine ID) win; series of another type are left out so
// one agent cannot break the scrape.
func (w *workerMetrics) Collect(ch chan<- prometheus.Metric) {
	type family struct {
		desc *prometheus.Desc
		typ  dto.MetricType
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	machines := make([]string, 0, len(w.agents))
	for id, a := range w.agents {
		if w.clock.Since(a.seen) > w.expiry {
			delete(w.agents, id)
			continue
		}
		machines = append(machines, id)
	}
	sort.Strings(machines)
	fams := map[string]family{}
	for _, id := range machines {
		for _, s := range w.agents[id].series {
			f, ok := fams[s.family]
			if !ok {
				f = family{desc: prometheus.NewDesc(s.family, s.help, nil, nil), typ: s.typ}
				fams[s.family] = f
			}
			if s.typ != f.typ {
				continue
			}
			ch <- snapshotMetric{desc: f.desc, m: s.m}
		}
	}
}

// snapshotMetric is one stored series as a prometheus.Metric.
type snapshotMetric struct {
	desc *prometheus.Desc
	m    *dto.Metric
}

func (s snapshotMetric) Desc() *prometheus.Desc { return s.desc }

func (s snapshotMetric) Write(out *dto.Metric) error {
	proto.Reset(out)
	proto.Merge(out, s.m)
	return nil
}

var _ prometheus.Collector = (*workerMetrics)(nil)
