package server

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

type metrics struct {
	rpcs *prometheus.CounterVec
	up   *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_rpcs_total", Help: "RPCs handled, by method and gRPC code.",
		}, []string{"method", "code"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "controlplane_dependency_up", Help: "1 when the dependency answers its health check.",
		}, []string{"dependency"}),
	}
	reg.MustRegister(m.rpcs, m.up)
	return m
}

func (m *metrics) setUp(dep string, up bool) {
	v := 0.0
	if up {
		v = 1
	}
	m.up.WithLabelValues(dep).Set(v)
}

func (m *metrics) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		m.rpcs.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
		return resp, err
	}
}
