package tunnel

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// streamListener turns a session's accepted streams into a net.Listener so
// a grpc.Server can serve them; there is no socket behind it.
type streamListener struct {
	s      Session
	ctx    context.Context
	cancel context.CancelFunc
}

// Listener returns a net.Listener whose Accept returns the streams the peer
// opens on s. Close stops Accept but leaves s open.
func Listener(s Session) net.Listener {
	ctx, cancel := context.WithCancel(context.Background())
	return &streamListener{s: s, ctx: ctx, cancel: cancel}
}

func (l *streamListener) Accept() (net.Conn, error) {
	c, err := l.s.AcceptStream(l.ctx)
	if err != nil {
		if l.ctx.Err() != nil {
			return nil, net.ErrClosed
		}
		return nil, err
	}
	return c, nil
}

func (l *streamListener) Close() error   { l.cancel(); return nil }
func (l *streamListener) Addr() net.Addr { return l.s.LocalAddr() }

// ServeGRPC serves srv on the streams the peer opens on s until s ends or
// ctx does; it blocks. Several sessions may share one grpc.Server.
// Handlers learn the caller with CallerFromContext.
func ServeGRPC(ctx context.Context, s Session, srv *grpc.Server) {
	l := Listener(s)
	// Accept fails once s ends, which ends Serve; ctx closes the listener.
	stop := context.AfterFunc(ctx, func() { _ = l.Close() })
	defer stop()
	_ = srv.Serve(l)
	_ = l.Close()
}

// CallerFromContext returns the tunnel address of the peer calling a gRPC
// handler served by ServeGRPC (its Identity is what the Authorizer returned).
func CallerFromContext(ctx context.Context) (*Addr, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, false
	}
	a, ok := p.Addr.(*Addr)
	return a, ok
}

// transportReadBuffer is each gRPC transport's read buffer over a tunnel
// stream (gRPC's default is 32 KiB, per agent and direction).
const transportReadBuffer = 4 << 10

// ServerOptions are the grpc.Server options matching lim (message size).
func ServerOptions(lim Limits) []grpc.ServerOption {
	lim = lim.WithDefaults()
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(lim.MaxMessageSize),
		grpc.MaxSendMsgSize(lim.MaxMessageSize),
		// One transport per agent, mostly idle: a small read buffer (the
		// tunnel stream buffers too; write buffers are shared by default).
		grpc.ReadBufferSize(transportReadBuffer),
	}
}

// NewClientConn returns a ClientConn whose connections are streams opened
// by open (Session.OpenStream or Auto.OpenStream). The session is already
// TLS-protected, so gRPC itself runs without transport security.
func NewClientConn(target string, open func(ctx context.Context) (net.Conn, error), lim Limits, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	lim = lim.WithDefaults()
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return open(ctx) }),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(lim.MaxMessageSize), grpc.MaxCallSendMsgSize(lim.MaxMessageSize)),
		grpc.WithReadBufferSize(transportReadBuffer),
	}
	cc, err := grpc.NewClient("passthrough:///"+target, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("gRPC client over tunnel to %s: %w", target, err)
	}
	return cc, nil
}

// Agent is one connected agent as the controlplane's Hub sees it.
type Agent struct {
	Identity  string
	Transport Transport
	Session   Session

	push *pushConn
}

// Conn returns the ClientConn that pushes to the agent: each of its
// connections is a stream the controlplane opens on the agent's session.
// It is made on first use and closed after HubConfig.PushIdleTimeout
// without calls (the next Conn makes a new one), and when the session ends.
// Call Conn for each push rather than keeping the ClientConn.
func (a *Agent) Conn() (*grpc.ClientConn, error) { return a.push.get() }

// HubConfig configures a Hub.
type HubConfig struct {
	// Server serves the agents' calls (heartbeats, status, logs) on streams
	// the agents open. Required.
	Server *grpc.Server
	// OnConnect and OnDisconnect let a registry (presence) follow agents.
	// They run on the session's goroutine and should not block long.
	OnConnect    func(a *Agent)
	OnDisconnect func(a *Agent, err error)
	Limits       Limits
	DialOptions  []grpc.DialOption
	// PushIdleTimeout closes an agent's push ClientConn after that long
	// without calls (default 2 minutes; see Agent.Conn).
	PushIdleTimeout time.Duration
	// Clock times PushIdleTimeout (default the wall clock).
	Clock clock.Clock
}

// Hub is the controlplane side of gRPC over tunnels: plug HandleSession into
// ServerConfig.OnSession, then push through Conn(identity). When an identity
// reconnects, the newest session wins and the older one is closed.
type Hub struct {
	cfg HubConfig

	// mu guards agents.
	mu     sync.Mutex
	agents map[string]*Agent
}

// NewHub returns an empty hub.
func NewHub(cfg HubConfig) (*Hub, error) {
	if cfg.Server == nil {
		return nil, fmt.Errorf("tunnel hub: server: required")
	}
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.PushIdleTimeout <= 0 {
		cfg.PushIdleTimeout = 2 * time.Minute
	}
	cfg.Clock = clock.OrReal(cfg.Clock)
	return &Hub{cfg: cfg, agents: make(map[string]*Agent)}, nil
}

// HandleSession serves one agent session until it ends. It blocks.
func (h *Hub) HandleSession(ctx context.Context, s Session) {
	a := &Agent{Identity: s.Identity(), Transport: s.Transport(), Session: s}
	a.push = newPushConn(a.Identity, h.cfg.PushIdleTimeout, h.cfg.Clock, func(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
		return NewClientConn(a.Identity, s.OpenStream, h.cfg.Limits, append(opts, h.cfg.DialOptions...)...)
	})
	h.mu.Lock()
	old := h.agents[a.Identity]
	h.agents[a.Identity] = a
	h.mu.Unlock()
	if old != nil {
		_ = old.Session.Close()
	}
	if h.cfg.OnConnect != nil {
		h.cfg.OnConnect(a)
	}
	ServeGRPC(ctx, s, h.cfg.Server)
	h.mu.Lock()
	if h.agents[a.Identity] == a {
		delete(h.agents, a.Identity)
	}
	h.mu.Unlock()
	a.push.end()
	serr := s.Err()
	if serr == nil {
		serr = ctx.Err()
	}
	_ = s.Close()
	if h.cfg.OnDisconnect != nil {
		h.cfg.OnDisconnect(a, serr)
	}
}

// ErrAgentNotConnected: no session for that identity on this hub.
var ErrAgentNotConnected = fmt.Errorf("agent not connected to this controlplane replica: %w", errdefs.ErrUnavailable)

// Conn returns the push ClientConn of a connected agent.
func (h *Hub) Conn(identity string) (*grpc.ClientConn, error) {
	h.mu.Lock()
	a, ok := h.agents[identity]
	h.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("agent %s: %w", identity, ErrAgentNotConnected)
	}
	return a.Conn()
}

// Agent returns the connected agent with identity, if any.
func (h *Hub) Agent(identity string) (*Agent, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a, ok := h.agents[identity]
	return a, ok
}

// Agents returns the connected agents.
func (h *Hub) Agents() []*Agent {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Agent, 0, len(h.agents))
	for _, a := range h.agents {
		out = append(out, a)
	}
	return out
}
