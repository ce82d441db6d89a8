package tunnel

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the tunnel's Prometheus series. One Metrics is shared by a
// Server or by the clients of one process; nil Metrics are allowed and
// count into series nobody registered.
type Metrics struct {
	sessions      *prometheus.GaugeVec   // side, transport
	handshakes    *prometheus.CounterVec // side, result
	reconnects    prometheus.Counter
	bytes         *prometheus.CounterVec // side, direction
	streamsOpened *prometheus.CounterVec // side
	streamsClosed *prometheus.CounterVec // side
	udpRefused    *prometheus.CounterVec // side
}

// Handshake results.
const (
	resultOK      = "ok"
	resultRefused = "refused"
	// resultRefusedSource: refused before any crypto because its source
	// already had MaxHandshakesPerSource handshakes in flight.
	resultRefusedSource = "refused_source"
	resultFailed        = "failed"
	// resultAbandoned: the agent hung up mid-handshake, as the loser of
	// its own happy-eyeballs race does. Not a failure to alert on.
	resultAbandoned = "abandoned"
)

// NewMetrics creates the series and registers them on reg (nil: not
// registered). Registering twice on the same registry fails.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		sessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "levers9", Subsystem: "tunnel", Name: "sessions",
			Help: "Connected tunnel sessions by side and transport.",
		}, []string{"side", "transport"}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "levers9", Subsystem: "tunnel", Name: "handshakes_total",
			Help: "Tunnel handshakes by side and result (ok, refused, refused_source: its source address had too many in flight, failed, abandoned: the agent hung up mid-handshake).",
		}, []string{"side", "result"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "levers9", Subsystem: "tunnel", Name: "reconnects_total",
			Help: "Sessions the agent side had to dial again after losing one.",
		}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "levers9", Subsystem: "tunnel", Name: "stream_bytes_total",
			Help: "Payload bytes carried by tunnel streams by side and direction (rx, tx).",
		}, []string{"side", "direction"}),
		streamsOpened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "levers9", Subsystem: "tunnel", Name: "streams_opened_total",
			Help: "Tunnel streams opened or accepted, by side.",
		}, []string{"side"}),
		streamsClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "levers9", Subsystem: "tunnel", Name: "streams_closed_total",
			Help: "Tunnel streams closed (locally or by session end), by side.",
		}, []string{"side"}),
		udpRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "levers9", Subsystem: "tunnel", Name: "udp_sends_refused_total",
			Help: "QUIC datagrams this host refused to send (EPERM: a firewall DROP in OUTPUT, a full conntrack table), by side; each counts as a lost packet, not a failed session.",
		}, []string{"side"}),
	}
	if reg != nil {
		var errs []error
		for _, c := range []prometheus.Collector{m.sessions, m.handshakes, m.reconnects, m.bytes, m.streamsOpened, m.streamsClosed, m.udpRefused} {
			if err := reg.Register(c); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, fmt.Errorf("registering tunnel metrics: %w", err)
		}
	}
	return m, nil
}

func orNewMetrics(m *Metrics) *Metrics {
	if m != nil {
		return m
	}
	m, _ = NewMetrics(nil)
	return m
}
