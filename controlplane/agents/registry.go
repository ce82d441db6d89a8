// Package agents owns the controlplane's end of the agents' tunnels: the
// tunnel listener (its server certificate signed by the agent CA), the
// authorizer that maps a client certificate to a machine and refuses
// unknown or deleted machines and any certificate but the machine's current
// one (or, until the agent has switched after a renewal, its previous one)
// before any stream is served, the periodic re-authorization that closes
// sessions whose machine or certificate no longer qualifies, the registry of
// connected agents, presence in Redis (which replica holds which agent), and
// pushes to an agent through whichever replica holds its tunnel (forwarded
// over Redis when it is another replica). It serves the agent API
// (heartbeats, certificate renewal, metrics snapshots, which it keeps per
// agent in memory and serves on the replica's /metrics labelled machine
// and pool: workermetrics.go). It never dials an agent, and never acts
// on a message or presence record from Redis that a replica holding the
// replica secret did not sign (replicaauth.go), nor puts a forwarded call's
// request or reply on Redis unencrypted (forwardseal.go).
package agents

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
	"github.com/levers9/levers9/tunnel"
)

// Config configures a Registry.
type Config struct {
	// Addr is the tunnel listen address (UDP and TCP).
	Addr string
	// Hosts go into the tunnel certificate (the public host, 127.0.0.1).
	Hosts   []string
	CA      *enroll.CA
	CertTTL time.Duration
	Store   *store.Store
	Redis   *redis.Client
	// Bus keeps what agents report for the API (egress readiness).
	Bus *bus.Bus
	Log *slog.Logger
	// Registerer takes the tunnel's and the registry's metrics.
	Registerer prometheus.Registerer
	Liveness   tunnel.Liveness
	// ResetKey is the QUIC stateless reset key (nil: a random one per
	// process, so agents of a restarted controlplane wait for their
	// heartbeat timeout).
	ResetKey *[32]byte
	// Tasks takes what agents report about their attempts; nil refuses
	// reports (Unavailable) and ignores heartbeats' attempt lists.
	Tasks Tasks
	// LostGrace is controlplane.lostAgentGrace, sent to agents as their
	// lease (0 sends none).
	LostGrace time.Duration
	// PresenceTTL is how long a replica's claim on an agent lives in Redis
	// without a refresh (default 30 s; refreshed every third of it).
	PresenceTTL time.Duration
	// MaxHandshakesPerSource is the tunnel's per-source handshake cap
	// (0: the tunnel's default).
	MaxHandshakesPerSource int
	// ReauthorizeInterval is how often every session this replica holds is
	// checked again against Postgres (default 30 s): a session whose machine
	// was deleted or whose certificate is no longer current is closed, even
	// if the drop message meant for this replica was lost.
	ReauthorizeInterval time.Duration
	// WorkerMetricsInterval is how often agents are told to send metrics
	// snapshots (0: each agent's own interval); WorkerMetricsExpiry how long
	// after its last snapshot an agent's series leave (default 1m);
	// WorkerMetricsMaxSeries caps the series kept per agent (default 2000).
	// The series are served through Registerer, labelled machine and pool.
	WorkerMetricsInterval  time.Duration
	WorkerMetricsExpiry    time.Duration
	WorkerMetricsMaxSeries int
	// Clock times presence refreshes, re-authorization and certificate
	// renewal (default the wall clock). The tunnel server keeps the wall clock: its heartbeats
	// meet connection deadlines, which are wall-clock instants.
	Clock clock.Clock
	// ReplicaSecret keys the MACs on what replicas exchange through Redis
	// (replicaauth.go); every replica sharing the Redis needs the same one.
	// Required. PreviousReplicaSecrets are still accepted (rotation).
	ReplicaSecret          string
	PreviousReplicaSecrets []string
}

// Tasks is what the registry hands agents' attempt reports to.
type Tasks interface {
	Report(ctx context.Context, machineID string, req *agentv1.ReportAttemptRequest) (*agentv1.ReportAttemptResponse, error)
	// Running reconciles the attempts an agent holds and returns those it
	// must stop.
	Running(ctx context.Context, machineID string, running []*agentv1.RunningAttempt) ([]*agentv1.RunningAttempt, error)
	// WorkerGone takes an attached cluster's agent's report of one of its
	// worker pods gone (it refuses workers the agent did not make).
	WorkerGone(ctx context.Context, agentID string, req *agentv1.WorkerGoneRequest) error
}

// Registry is one replica's view of connected agents. Start/Stop follow the
// start-stop contract.
type Registry struct {
	cfg     Config
	replica string
	server  *tunnel.Server
	hub     *tunnel.Hub
	grpc    *grpc.Server
	fwd     *forwarder
	auth    *replicaAuth
	metrics *registryMetrics
	tm      *tunnel.Metrics
	// workers holds the agents' metrics snapshots (workermetrics.go).
	workers *workerMetrics

	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards the fields below.
	mu      sync.Mutex
	started bool
	stopped bool
	// pools maps each locally connected machine to its pool, for the
	// machines-online metric.
	pools map[string]string
	// onPrev holds the local sessions that presented their machine's
	// previous certificate at the last re-authorization (see reauthorize).
	onPrev map[*tunnel.Agent]bool
	// stale holds the local sessions admitted on the previous certificate:
	// their agent reconnected without the new one, so it must renew again.
	stale map[string]*tunnel.Agent
}

// New builds a registry; nothing listens until Start.
func New(cfg Config) (*Registry, error) {
	if cfg.CA == nil || cfg.Store == nil || cfg.Redis == nil || cfg.Bus == nil {
		return nil, errors.New("agents: CA, Store, Redis and Bus are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.PresenceTTL == 0 {
		cfg.PresenceTTL = 30 * time.Second
	}
	if cfg.CertTTL == 0 {
		cfg.CertTTL = 24 * time.Hour
	}
	if cfg.ReauthorizeInterval <= 0 {
		cfg.ReauthorizeInterval = 30 * time.Second
	}
	cfg.Clock = clock.OrReal(cfg.Clock)
	r := &Registry{cfg: cfg, replica: ids.New("rep"), pools: map[string]string{}, onPrev: map[*tunnel.Agent]bool{},
		stale: map[string]*tunnel.Agent{}}
	r.metrics = newRegistryMetrics(cfg.Registerer)
	var err error
	if r.auth, err = newReplicaAuth(cfg.ReplicaSecret, cfg.PreviousReplicaSecrets, cfg.Clock, cfg.Log, r.metrics.replicaRejected); err != nil {
		return nil, err
	}
	if r.tm, err = tunnel.NewMetrics(cfg.Registerer); err != nil {
		return nil, fmt.Errorf("tunnel metrics: %w", err)
	}
	r.workers = newWorkerMetrics(cfg.Clock, cfg.Log, cfg.WorkerMetricsExpiry, cfg.WorkerMetricsMaxSeries)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(r.workers); err != nil {
			return nil, fmt.Errorf("worker metrics: %w", err)
		}
	}
	return r, nil
}

// ReplicaID names this replica in presence records.
func (r *Registry) ReplicaID() string { return r.replica }

// Start listens for tunnels and starts the presence and forwarding loops.
// After a failed Start (port taken, Redis down) Start may be called again.
func (r *Registry) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || r.stopped {
		return errors.New("agents: already started or stopped")
	}
	if err := r.startLocked(ctx); err != nil {
		return err
	}
	r.started = true
	return nil
}

func (r *Registry) startLocked(ctx context.Context) error {
	cert, err := r.cfg.CA.ServerCertificate(r.cfg.Hosts, 10*365*24*time.Hour)
	if err != nil {
		return err
	}
	r.grpc = grpc.NewServer(tunnel.ServerOptions(tunnel.Limits{})...)
	agentv1.RegisterControlplaneServer(r.grpc, &controlplaneService{r: r})
	r.hub, err = tunnel.NewHub(tunnel.HubConfig{Server: r.grpc, OnConnect: r.onConnect, OnDisconnect: r.onDisconnect})
	if err != nil {
		return err
	}
	r.server, err = tunnel.NewServer(tunnel.ServerConfig{
		Addr:      r.cfg.Addr,
		TLS:       &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: r.cfg.CA.Pool()},
		Authorize: r.authorize,
		OnSession: r.hub.HandleSession,
		Liveness:  r.cfg.Liveness,
		// Every replica and every restart derives the same key, so a
		// restarted controlplane resets agents' old QUIC connections at
		// their next packet.
		QUICStatelessResetKey:  r.cfg.ResetKey,
		MaxHandshakesPerSource: r.cfg.MaxHandshakesPerSource,
		Logger:                 r.cfg.Log.With("component", "tunnel"),
		Metrics:                r.tm,
	})
	if err != nil {
		return err
	}
	if err := r.server.Start(ctx); err != nil {
		r.grpc.Stop()
		return fmt.Errorf("listen for tunnels on %s: %w", r.cfg.Addr, err)
	}
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	r.fwd = newForwarder(r)
	if err := r.fwd.start(loopCtx, &r.wg); err != nil {
		cancel()
		r.server.Stop()
		r.grpc.Stop()
		return err
	}
	r.wg.Add(1)
	go func() { defer r.wg.Done(); r.presenceLoop(loopCtx) }()
	r.wg.Add(1)
	go func() { defer r.wg.Done(); r.reauthorizeLoop(loopCtx) }()
	r.cfg.Log.Info("listening for agent tunnels", "addr", r.server.Addr().String(), "replica", r.replica)
	return nil
}

// Stop closes every tunnel and waits. Safe twice or before Start.
func (r *Registry) Stop() {
	r.mu.Lock()
	if !r.started || r.stopped {
		r.stopped = true
		r.mu.Unlock()
		return
	}
	r.stopped = true
	r.mu.Unlock()
	r.cancel()
	r.server.Stop()
	r.wg.Wait()
	r.grpc.Stop()
	// Give up our presence claims so other replicas stop forwarding here.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, a := range r.hub.Agents() {
		r.releasePresence(ctx, a.Identity)
	}
}

// Addr is the bound tunnel address (TCP; UDP has the same port).
func (r *Registry) Addr() net.Addr { return r.server.Addr() }

// authorize maps a client certificate to its machine; unknown and deleted
// machines, and certificates that are not the machine's current or (until
// the agent has switched) previous one, are refused before any stream is
// served. The first session on the current certificate retires the
// previous one.
func (r *Registry) authorize(ctx context.Context, cert *x509.Certificate) (string, error) {
	id, err := enroll.MachineID(cert)
	if err != nil {
		r.metrics.refused.WithLabelValues("no_machine").Inc()
		return "", err
	}
	m, err := r.cfg.Store.MachineByID(ctx, id)
	if errdefs.IsNotFound(err) {
		r.metrics.refused.WithLabelValues("unknown").Inc()
		return "", fmt.Errorf("machine %s is not known: %w", id, errdefs.ErrPermissionDenied)
	}
	if err != nil {
		return "", err
	}
	if m.DeletedAt != nil {
		r.metrics.refused.WithLabelValues("deleted").Inc()
		r.cfg.Log.Warn("tunnel refused: machine deleted", "machine_id", id, "audit", true)
		return "", fmt.Errorf("machine %s was deleted; its certificate is revoked: %w", id, errdefs.ErrPermissionDenied)
	}
	serial := serialOf(cert)
	switch {
	case serial == m.CertSerial:
		if m.PrevCertSerial == "" {
			break
		}
		retired, err := r.cfg.Store.RetireCertificate(ctx, id, serial)
		if err != nil {
			return "", err
		}
		if retired {
			r.cfg.Log.Info("previous agent certificate retired", "machine_id", id, "serial", serial, "prev_serial", m.PrevCertSerial, "audit", true)
		}
	case serial == m.PrevCertSerial:
		r.cfg.Log.Info("tunnel admitted on the previous certificate", "machine_id", id, "serial", serial, "current_serial", m.CertSerial)
	default:
		r.metrics.refused.WithLabelValues("not_current").Inc()
		r.cfg.Log.Warn("tunnel refused: certificate not current", "machine_id", id, "serial", serial, "current_serial", m.CertSerial, "audit", true)
		return "", fmt.Errorf("machine %s: certificate %s was replaced; only the machine's current certificate is admitted: %w", id, serial, errdefs.ErrPermissionDenied)
	}
	return id, nil
}

// serialOf is a certificate's serial as machines.cert_serial records it.
func serialOf(cert *x509.Certificate) string {
	if cert == nil || cert.SerialNumber == nil {
		return ""
	}
	return cert.SerialNumber.Text(16)
}

func (r *Registry) onConnect(a *tunnel.Agent) {
	r.metrics.connected.WithLabelValues(string(a.Transport)).Inc()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r.claimPresence(ctx, a.Identity, string(a.Transport))
	if m, err := r.cfg.Store.MachineByID(ctx, a.Identity); err == nil {
		r.mu.Lock()
		if _, seen := r.pools[a.Identity]; !seen {
			r.pools[a.Identity] = m.Pool
			r.metrics.online.WithLabelValues(m.Pool).Inc()
		}
		if s := serialOf(a.Session.PeerCertificate()); s != m.CertSerial && s == m.PrevCertSerial {
			r.stale[a.Identity] = a
		}
		r.mu.Unlock()
	}
	if _, err := r.cfg.Store.Heartbeat(ctx, a.Identity, string(a.Transport), "", nil); err != nil && !errdefs.IsCanceled(err) {
		r.cfg.Log.Warn("record connect", "machine_id", a.Identity, "err", err)
	}
	r.cfg.Log.Info("agent connected", "machine_id", a.Identity, "transport", a.Transport)
}

func (r *Registry) onDisconnect(a *tunnel.Agent, err error) {
	r.metrics.connected.WithLabelValues(string(a.Transport)).Dec()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// A reconnect may already have replaced this session.
	if cur, ok := r.hub.Agent(a.Identity); ok && cur != a {
		return
	}
	r.releasePresence(ctx, a.Identity)
	r.mu.Lock()
	if r.stale[a.Identity] == a {
		delete(r.stale, a.Identity)
	}
	if pool, ok := r.pools[a.Identity]; ok {
		delete(r.pools, a.Identity)
		r.metrics.online.WithLabelValues(pool).Dec()
	}
	r.mu.Unlock()
	r.cfg.Log.Info("agent disconnected", "machine_id", a.Identity, "transport", a.Transport, "reason", errString(err))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// local returns this replica's session for machineID.
func (r *Registry) local(machineID string) (*tunnel.Agent, bool) {
	return r.hub.Agent(machineID)
}

// Online reports whether machineID holds a tunnel to any replica. A nil
// Registry (the server's before its tunnel endpoint starts) has none.
func (r *Registry) Online(machineID string) (string, bool) {
	if r == nil {
		return "", false
	}
	if a, ok := r.local(machineID); ok {
		return string(a.Transport), true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p, ok := r.presence(ctx, machineID)
	return p.Transport, ok
}

// Drop closes machineID's tunnel wherever it is held.
func (r *Registry) Drop(machineID string) {
	if a, ok := r.local(machineID); ok {
		_ = a.Session.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if p, ok := r.presence(ctx, machineID); ok {
		r.fwd.sendDrop(ctx, p.Replica, machineID)
	}
}

// Conn returns a connection that pushes to machineID: the local tunnel, or
// a forwarder through the replica that holds it.
func (r *Registry) Conn(ctx context.Context, machineID string) (grpc.ClientConnInterface, error) {
	if conn, err := r.hub.Conn(machineID); err == nil {
		return conn, nil
	}
	p, ok := r.presence(ctx, machineID)
	if !ok {
		return nil, fmt.Errorf("machine %s: %w", machineID, errAgentOffline)
	}
	return &forwardConn{fwd: r.fwd, replica: p.Replica, machineID: machineID}, nil
}

var errAgentOffline = fmt.Errorf("agent is not connected to any controlplane replica: %w", errdefs.ErrUnavailable)

// poolOf is a connected machine's pool, from the registry's record of its
// connection or else from Postgres.
func (r *Registry) poolOf(ctx context.Context, machineID string) (string, error) {
	r.mu.Lock()
	pool, ok := r.pools[machineID]
	r.mu.Unlock()
	if ok {
		return pool, nil
	}
	m, err := r.cfg.Store.MachineByID(ctx, machineID)
	if err != nil {
		return "", fmt.Errorf("machine %s: %w", machineID, err)
	}
	return m.Pool, nil
}
