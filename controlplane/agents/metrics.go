package agents

import (
	"github.com/prometheus/client_golang/prometheus"
)

type registryMetrics struct {
	connected *prometheus.GaugeVec
	refused   *prometheus.CounterVec
	// reauthClosed counts sessions closed by re-authorization, by reason.
	reauthClosed *prometheus.CounterVec
	forwarded    *prometheus.CounterVec
	online       *prometheus.GaugeVec
	// replicaRejected counts messages from Redis refused by replicaAuth.
	replicaRejected *prometheus.CounterVec
}

func newRegistryMetrics(reg prometheus.Registerer) *registryMetrics {
	m := &registryMetrics{
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "controlplane_agents_connected", Help: "Agents holding a tunnel to this replica, by transport.",
		}, []string{"transport"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_agent_tunnels_refused_total", Help: "Tunnels refused by the authorizer, by reason.",
		}, []string{"reason"}),
		reauthClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_agent_tunnels_closed_total",
			Help: "Tunnels closed by re-authorization, by reason (deleted, unknown, not_current, renewed).",
		}, []string{"reason"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_agent_calls_forwarded_total", Help: "Pushes forwarded between replicas (sent, served).",
		}, []string{"direction"}),
	}
	m.online = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "controlplane_machines_online", Help: "Machines holding a tunnel to this replica, by pool.",
	}, []string{"pool"})
	m.replicaRejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "levers9_replica_messages_rejected_total",
		Help: "Forwarded calls, replies, drops, pings and presence records read from Redis and refused (bad_mac, stale, future, replayed, malformed).",
	}, []string{"reason"})
	if reg != nil {
		reg.MustRegister(m.connected, m.refused, m.reauthClosed, m.forwarded, m.online, m.replicaRejected)
	}
	return m
}
