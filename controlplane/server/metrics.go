package server

import (
	"context"
	"crypto/subtle"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type metrics struct {
	rpcs        *prometheus.CounterVec
	up          *prometheus.GaugeVec
	enrollments prometheus.Counter
	refusedJoin prometheus.Counter
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
	m.enrollments = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "controlplane_enrollments_total", Help: "Machines enrolled with a join token.",
	})
	m.refusedJoin = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "controlplane_join_tokens_refused_total", Help: "Enrollments refused: bad, reused, expired or forged join tokens, bad CSRs.",
	})
	reg.MustRegister(m.rpcs, m.up, m.enrollments, m.refusedJoin)
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

func (m *metrics) Enrolled()    { m.enrollments.Inc() }
func (m *metrics) RefusedJoin() { m.refusedJoin.Inc() }

// metricsHandler serves the registry, behind controlplane.metrics.token when
// one is set. The token is compared in constant time and never logged.
func (s *Server) metricsHandler() http.Handler {
	h := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	token := s.cfg.Controlplane.Metrics.Token
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="levers9 metrics"`)
			writeJSONError(w, http.StatusUnauthorized, codes.Unauthenticated, "metrics need controlplane.metrics.token as a bearer token")
			return
		}
		h.ServeHTTP(w, r)
	})
}
