package agent

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
)

// DefaultMetricsInterval is how often an agent sends a metrics snapshot
// when neither --metrics-interval nor the controlplane says otherwise.
const DefaultMetricsInterval = 15 * time.Second

// Metrics is the agent's one Prometheus registry and the series the agent
// keeps itself. BuildNode registers the egress node's and the image
// cache's metrics on Registry; parts built later (the seccomp log reader)
// take the handles they increment from here. Nothing serves Registry on a
// port: the agent sends snapshots of it over its tunnel (ReportMetrics)
// and the controlplane serves them, labelled machine and pool.
// Every field is safe for concurrent use.
type Metrics struct {
	Registry *prometheus.Registry
	// SeccompLogEvents is worker_seccomp_log_events_total{pool,task,syscall}:
	// syscalls seccomp log mode let through that enforce would refuse.
	SeccompLogEvents *prometheus.CounterVec
	// TaskStarts is worker_task_starts_total{pool,result}: attempts taken,
	// by whether their container started (started) or not (failed).
	TaskStarts *prometheus.CounterVec
	// TaskStartSeconds is worker_task_start_seconds{pool}: from RunTask to
	// the container running (image pull and network included).
	TaskStartSeconds *prometheus.HistogramVec
	// TaskStartPhaseSeconds is worker_task_start_phase_seconds{pool,phase}:
	// the parts of a start that succeeded (each prestart hook: image,
	// volumes, network, io, logs; the sandbox's prepare, create and start).
	// The image, volumes and network phases overlap: they run side by side.
	TaskStartPhaseSeconds *prometheus.HistogramVec
	// TunnelConnected is worker_tunnel_connected{transport}: 1 while a
	// session over that transport is up.
	TunnelConnected *prometheus.GaugeVec
	// TunnelSessions is worker_tunnel_sessions_total: sessions opened.
	TunnelSessions prometheus.Counter
}

// NewMetrics makes the registry with the agent's own series registered.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		SeccompLogEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "worker_seccomp_log_events_total",
			Help: "Syscalls seccomp log mode let through that enforce would refuse, by task and syscall.",
		}, []string{"pool", "task", "syscall"}),
		TaskStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "worker_task_starts_total",
			Help: "Attempts taken, by whether their container started.",
		}, []string{"pool", "result"}),
		TaskStartSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "worker_task_start_seconds",
			Help:    "Seconds from taking an attempt to its container running (image pull and network included).",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"pool"}),
		TaskStartPhaseSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "worker_task_start_phase_seconds",
			Help:    "Seconds each part of a container's start took (prestart hooks by name; the sandbox's prepare, create and start).",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60},
		}, []string{"pool", "phase"}),
		TunnelConnected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "worker_tunnel_connected",
			Help: "1 while the agent's tunnel session over this transport is up.",
		}, []string{"transport"}),
		TunnelSessions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "worker_tunnel_sessions_total",
			Help: "Tunnel sessions the agent opened.",
		}),
	}
	m.Registry.MustRegister(m.SeccompLogEvents, m.TaskStarts, m.TaskStartSeconds, m.TaskStartPhaseSeconds, m.TunnelConnected, m.TunnelSessions)
	return m
}

// snapshotter turns successive gathers of a registry into reports that
// carry only what changed since the last acknowledged one:
//
//	next ──> report(seq, base=acked) ──> ack(resp)
//	            │ acked_seq == seq: base := what was sent
//	            │ need_full, or a failed send: base stays (need_full: none)
//
// A report against base 0 is full. It is used by one goroutine.
type snapshotter struct {
	gen   uint64
	seq   uint64
	acked uint64
	// base is the acknowledged snapshot (series key -> marshalled
	// metric); sent is the one in flight.
	base, sent map[string][]byte
}

func newSnapshotter() *snapshotter {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &snapshotter{gen: binary.BigEndian.Uint64(b[:]) | 1}
}

// seriesKey names a series by family and labels (sorted, as gathered).
func seriesKey(family string, m *dto.Metric) string {
	var b strings.Builder
	b.WriteString(family)
	labels := append([]*dto.LabelPair{}, m.GetLabel()...)
	sort.Slice(labels, func(i, j int) bool { return labels[i].GetName() < labels[j].GetName() })
	for _, l := range labels {
		b.WriteByte(0xff)
		b.WriteString(l.GetName())
		b.WriteByte('=')
		b.WriteString(l.GetValue())
	}
	return b.String()
}

// next builds the report of fams against the acknowledged snapshot.
func (s *snapshotter) next(fams []*dto.MetricFamily) (*agentv1.MetricsReportRequest, error) {
	s.seq++
	req := &agentv1.MetricsReportRequest{Generation: s.gen, Seq: s.seq, BaseSeq: s.acked}
	cur := map[string][]byte{}
	opts := proto.MarshalOptions{Deterministic: true}
	for _, f := range fams {
		var changed []*dto.Metric
		for _, m := range f.GetMetric() {
			b, err := opts.Marshal(m)
			if err != nil {
				return nil, fmt.Errorf("metrics snapshot: %s: %w", f.GetName(), err)
			}
			k := seriesKey(f.GetName(), m)
			cur[k] = b
			if old, ok := s.base[k]; s.acked != 0 && ok && string(old) == string(b) {
				continue
			}
			changed = append(changed, m)
		}
		if len(changed) == 0 {
			continue
		}
		b, err := opts.Marshal(&dto.MetricFamily{Name: f.Name, Help: f.Help, Type: f.Type, Unit: f.Unit, Metric: changed})
		if err != nil {
			return nil, fmt.Errorf("metrics snapshot: %s: %w", f.GetName(), err)
		}
		req.Changed = append(req.Changed, b)
	}
	if s.acked != 0 {
		gone := map[string][]*dto.Metric{}
		for k, b := range s.base {
			if _, ok := cur[k]; ok {
				continue
			}
			var m dto.Metric
			if err := proto.Unmarshal(b, &m); err != nil {
				return nil, err
			}
			name, _, _ := strings.Cut(k, "\xff")
			gone[name] = append(gone[name], &dto.Metric{Label: m.Label})
		}
		names := make([]string, 0, len(gone))
		for n := range gone {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			b, err := opts.Marshal(&dto.MetricFamily{Name: proto.String(n), Metric: gone[n]})
			if err != nil {
				return nil, err
			}
			req.Removed = append(req.Removed, b)
		}
	}
	s.sent = cur
	return req, nil
}

// ack records the controlplane's answer to the report of seq; a failed
// send is no answer (the next report is against the same base).
func (s *snapshotter) ack(seq uint64, resp *agentv1.MetricsReportResponse) {
	switch {
	case resp.GetNeedFull():
		s.acked, s.base = 0, nil
	case resp.GetAckedSeq() == seq && seq == s.seq:
		s.acked, s.base = seq, s.sent
	}
	s.sent = nil
}

// setMetricsInterval takes the interval a heartbeat answer named (0: the
// agent's own) and wakes the snapshot loop when it changed.
func (a *Agent) setMetricsInterval(d time.Duration) {
	if a.metricsEvery.Swap(int64(d)) == int64(d) {
		return
	}
	select {
	case a.metricsWake <- struct{}{}:
	default:
	}
}

// sendMetrics sends a snapshot of the registry every interval until ctx
// ends, each against the last one the controlplane acknowledged.
func (a *Agent) sendMetrics(ctx context.Context) {
	cp := agentv1.NewControlplaneClient(a.cp)
	snap := newSnapshotter()
	log := a.o.Log.With("component", "metrics", "machine_id", a.settings.MachineID)
	for {
		every := time.Duration(a.metricsEvery.Load())
		if every <= 0 {
			every = a.o.MetricsInterval
		}
		t := a.o.Clock.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.metricsWake:
			t.Stop()
			continue
		case <-t.C():
		}
		fams, err := a.o.Metrics.Registry.Gather()
		if err != nil {
			log.Warn("gather metrics", "err", err)
			continue
		}
		for range 2 { // a need_full answer is followed by the full snapshot at once
			req, err := snap.next(fams)
			if err != nil {
				log.Warn("metrics snapshot", "err", err)
				break
			}
			sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			resp, err := cp.ReportMetrics(sctx, req, grpc.WaitForReady(true))
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					log.Debug("metrics snapshot not sent", "err", err)
				}
				snap.ack(req.Seq, nil)
				break
			}
			snap.ack(req.Seq, resp)
			if !resp.NeedFull {
				break
			}
		}
	}
}
