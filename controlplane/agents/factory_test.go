package agents_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/controlplane/agents"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/ids"
	"github.com/levers9/levers9/tunnel"
)

// bundle is what replicas share: one database, one Redis, one agent CA.
type bundle struct {
	st  *store.Store
	bus *bus.Bus
	ca  *enroll.CA
	ws  store.Workspace
}

func setup(t *testing.T) *bundle {
	t.Helper()
	st, _ := env.NewStore(t)
	ca, _, _, err := enroll.NewCA("levers9-agents-test")
	if err != nil {
		t.Fatal(err)
	}
	ws := store.Workspace{ID: ids.New("ws"), Name: "agents-test", CreatedAt: time.Now()}
	if err := st.CreateWorkspace(context.Background(), ws); err != nil {
		t.Fatal(err)
	}
	return &bundle{st: st, bus: env.NewBus(t), ca: ca, ws: ws}
}

// testReplicaSecret is what every replica of these tests signs with.
const testReplicaSecret = "agents-test-replica-secret-0123456789"

// replica starts a registry on a free port; mutate adjusts its config.
// Its logs are returned for assertions.
func (b *bundle) replica(t *testing.T, mutate func(*agents.Config)) (*agents.Registry, *controlplanetest.Logs) {
	t.Helper()
	port, err := devstack.FreeTCPUDPPort()
	if err != nil {
		t.Fatal(err)
	}
	logs := &controlplanetest.Logs{}
	cfg := agents.Config{Addr: fmt.Sprintf("127.0.0.1:%d", port), Hosts: []string{"127.0.0.1"}, CA: b.ca, CertTTL: 24 * time.Hour,
		Store: b.st, Redis: b.bus.Redis(), Bus: b.bus, Log: slog.New(slog.NewJSONHandler(logs, nil)), ReplicaSecret: testReplicaSecret}
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := agents.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r, logs
}

// machine creates and enrolls a machine and returns its ID and client
// certificate (signed by the bundle's CA, valid for certTTL).
func (b *bundle) machine(t *testing.T, certTTL time.Duration) (string, tls.Certificate) {
	t.Helper()
	ctx := context.Background()
	jtID, raw, hash := enroll.MintJoinToken()
	jt, err := enroll.ParseJoinToken(raw)
	if err != nil {
		t.Fatal(err)
	}
	id := ids.New("m")
	if err := b.st.CreateMachine(ctx, store.Machine{ID: id, WorkspaceID: b.ws.ID, Name: id, Pool: "default", CreatedAt: time.Now()},
		store.JoinTokenRow{ID: jtID, Hash: hash, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	keyPEM, csrPEM, err := enroll.NewKeyAndCSR("box")
	if err != nil {
		t.Fatal(err)
	}
	csr, err := enroll.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	var certPEM []byte
	_, err = b.st.Enroll(ctx, jt.ID, time.Now(), jt.Matches, func(m store.Machine) (store.Enrollment, error) {
		var notAfter time.Time
		var err error
		if certPEM, notAfter, err = b.ca.Sign(csr, m.ID, certTTL); err != nil {
			return store.Enrollment{}, err
		}
		serial, err := enroll.SerialOf(certPEM)
		return store.Enrollment{Serial: serial, NotAfter: notAfter, AgentVersion: "test"}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return id, cert
}

// fakeAgent holds a real tunnel to one replica and answers pings; it is
// the agent at the tunnel boundary and nothing more.
type fakeAgent struct {
	id   string
	auto *tunnel.Auto

	// mu guards the fields below.
	mu       sync.Mutex
	cp       agentv1.ControlplaneClient
	sessions int
}

// connect dials r's tunnel as machine id until the test ends.
func connect(t *testing.T, b *bundle, r *agents.Registry, id string, cert tls.Certificate) *fakeAgent {
	t.Helper()
	a := &fakeAgent{id: id}
	var err error
	a.auto, err = tunnel.NewAuto(tunnel.ClientConfig{Addrs: []string{r.Addr().String()},
		TLS:         &tls.Config{RootCAs: b.ca.Pool(), Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"},
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}, a.onSession)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.auto.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.auto.Stop)
	return a
}

func (a *fakeAgent) onSession(ctx context.Context, s tunnel.Session) {
	conn, err := tunnel.NewClientConn("controlplane", s.OpenStream, tunnel.Limits{})
	if err != nil {
		return
	}
	defer conn.Close()
	srv := grpc.NewServer(tunnel.ServerOptions(tunnel.Limits{})...)
	agentv1.RegisterAgentServer(srv, &pingService{id: a.id})
	served := make(chan struct{})
	go func() { defer close(served); tunnel.ServeGRPC(ctx, s, srv) }()
	a.mu.Lock()
	a.cp = agentv1.NewControlplaneClient(conn)
	a.sessions++
	a.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-s.Done():
	}
	srv.Stop()
	<-served
}

// controlplane is the client of the current session (nil before the first).
func (a *fakeAgent) controlplane() agentv1.ControlplaneClient {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cp
}

func (a *fakeAgent) sessionCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessions
}

type pingService struct {
	agentv1.UnimplementedAgentServer
	id string
}

func (p *pingService) Ping(_ context.Context, req *agentv1.PingRequest) (*agentv1.PingResponse, error) {
	return &agentv1.PingResponse{MachineId: p.id, Payload: req.Payload}, nil
}
