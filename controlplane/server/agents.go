package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"net"

	"github.com/levers9/levers9/controlplane/agents"
)

// startAgents starts the tunnel endpoint once the agent CA is loaded; after
// a failure the same registry is started again on the next check.
func (s *Server) startAgents(ctx context.Context) error {
	ca := s.ca.Load()
	if ca == nil || s.agents.Load() != nil {
		return nil
	}
	if s.pendingAgents != nil {
		return s.startRegistry(ctx, s.pendingAgents)
	}
	hosts := []string{s.cfg.Controlplane.PublicHost, "127.0.0.1", "::1", "localhost"}
	if h, _, err := net.SplitHostPort(s.cfg.Controlplane.TunnelAddr); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	secret, previous, derived := s.cfg.ReplicaSecrets()
	if derived {
		s.log.Warn("controlplane.replicaSecret is not set: messages between replicas are authenticated with a key derived from database.postgres.encryptionKey; set a dedicated replicaSecret (the same on every replica) when replicas share Redis",
			"key", "controlplane.replicaSecret")
	}
	r, err := agents.New(agents.Config{
		Addr: s.cfg.Controlplane.TunnelAddr, Hosts: hosts, CA: ca, CertTTL: s.cfg.Controlplane.CertTTL(),
		Store: s.store, Redis: s.bus.Redis(), Bus: s.bus, Log: s.log.With("component", "agents"), Registerer: s.reg,
		Tasks: s.tasks, ResetKey: s.resetKey(), ReplicaSecret: secret, PreviousReplicaSecrets: previous,
		MaxHandshakesPerSource: s.cfg.Controlplane.TunnelMaxHandshakesPerSource,
		WorkerMetricsInterval:  s.cfg.Controlplane.Metrics.WorkerMetricsInterval(),
		WorkerMetricsExpiry:    s.cfg.Controlplane.Metrics.WorkerMetricsExpiry(),
		WorkerMetricsMaxSeries: s.cfg.Controlplane.Metrics.WorkerMaxSeries,
		LostGrace:              s.cfg.Controlplane.LostGrace(),
	})
	if err != nil {
		return err
	}
	s.pendingAgents = r
	return s.startRegistry(ctx, r)
}

func (s *Server) startRegistry(ctx context.Context, r *agents.Registry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	s.agents.Store(r)
	return nil
}

// resetKey derives the tunnel's QUIC stateless reset key from the
// encryption key, a secret every replica shares and keeps across restarts.
func (s *Server) resetKey() *[32]byte {
	mac := hmac.New(sha256.New, []byte(s.cfg.Database.Postgres.EncryptionKey))
	mac.Write([]byte("levers9 quic stateless reset key"))
	var k [32]byte
	copy(k[:], mac.Sum(nil))
	return &k
}

// Agents is the tunnel registry, nil until Postgres has been reached.
func (s *Server) Agents() *agents.Registry { return s.agents.Load() }

// presence is the api.Presence before and after the registry starts.
type presence struct{ s *Server }

func (p presence) Online(machineID string) (string, bool) {
	if r := p.s.agents.Load(); r != nil {
		return r.Online(machineID)
	}
	return "", false
}

func (p presence) Drop(machineID string) {
	if r := p.s.agents.Load(); r != nil {
		r.Drop(machineID)
	}
}
