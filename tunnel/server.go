package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// Authorizer maps a verified client certificate to an identity (a machine)
// or refuses it. It runs after TLS verified the chain and validity period
// and before any stream of the session is served. Returning an error that is
// retryable (errdefs.IsRetryable) refuses with a retry-after hint; any other
// error refuses permanently (unknown, revoked). It must be safe for
// concurrent use and should return quickly.
type Authorizer func(ctx context.Context, cert *x509.Certificate) (identity string, err error)

// ServerConfig configures a Server. TLS must carry the server certificate
// and the CA pool agents' certificates chain to (ClientCAs); the server
// forces TLS 1.3, client certificate verification and the ALPN.
type ServerConfig struct {
	// Addr is where to listen, UDP and TCP on the same port (default ":1995").
	// With port 0 the TCP port is chosen and UDP binds the same number.
	Addr      string
	TLS       *tls.Config
	Authorize Authorizer
	// OnSession runs in its own goroutine for every admitted session; the
	// server closes the session when it returns. ctx ends on Stop.
	OnSession func(ctx context.Context, s Session)
	// HandshakesPerSecond and HandshakeBurst bound admissions (defaults 1000
	// and 200: 5,000 agents back within ~5 s of a restart on a small
	// machine); over them agents are refused with a retry-after hint.
	HandshakesPerSecond float64
	HandshakeBurst      int
	// MaxConcurrentHandshakes caps connections between accept and verdict
	// (default 1024). Over it a new connection is refused before any crypto
	// (TCP: a busy record with a retry-after hint; QUIC: CONNECTION_REFUSED)
	// and the agent backs off: the server does only the handshakes it can
	// finish in time instead of starting thousands that all time out
	// (congestion collapse). Set it well above the handshakes a second
	// brings: slow clients hold slots too, and every refusal is redone.
	MaxConcurrentHandshakes int
	// MaxHandshakesPerSource caps the handshakes in flight from one source
	// (an IPv4 address or an IPv6 /64; default 64), refused the same way
	// and counted as "refused_source". Sessions are not capped per source:
	// a fleet behind one NAT address gets in, this many handshakes at a
	// time. Behind a TCP load balancer that hides agents' addresses, raise
	// it to MaxConcurrentHandshakes.
	MaxHandshakesPerSource int
	// QUICRetryThreshold: once this many handshakes are in flight, a new
	// QUIC connection must first answer a Retry from its source address
	// (one more round trip), so spoofed Initials take no slot (default
	// half of MaxConcurrentHandshakes).
	QUICRetryThreshold int
	// ClientHelloTimeout: a TCP connection whose first TLS record (the
	// ClientHello) has not fully arrived this long after accept is closed
	// (default 3 s); only then does it get the rest of
	// Liveness.HandshakeTimeout. A peer that connects and sends nothing,
	// or a few bytes (slowloris), holds its slot this long and no longer.
	ClientHelloTimeout time.Duration
	// QUICStatelessResetKey, when the same across restarts (derive it from
	// a secret), lets a restarted server reset the agents' old QUIC
	// connections at their next packet instead of leaving them to time out.
	QUICStatelessResetKey *[32]byte
	Liveness              Liveness
	Limits                Limits
	Logger                *slog.Logger
	Metrics               *Metrics
	// Clock times admission and heartbeats (default the wall clock; see
	// ClientConfig.Clock about fake ones).
	Clock clock.Clock
}

// WithDefaults fills zero fields.
func (c ServerConfig) WithDefaults() ServerConfig {
	orDefault(&c.Addr, ":"+DefaultPort)
	orDefault(&c.HandshakesPerSecond, 1000)
	orDefault(&c.HandshakeBurst, 200)
	orDefault(&c.MaxConcurrentHandshakes, 1024)
	orDefault(&c.MaxHandshakesPerSource, 64)
	orDefault(&c.QUICRetryThreshold, max(c.MaxConcurrentHandshakes/2, 1))
	orDefault(&c.ClientHelloTimeout, 3*time.Second)
	sharedDefaults(&c.Liveness, &c.Limits, &c.Logger, &c.Metrics, &c.Clock)
	return c
}

// Validate reports every bad field at once.
func (c ServerConfig) Validate() error {
	var errs []error
	if c.TLS == nil || len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil {
		errs = append(errs, fmt.Errorf("tunnel.server.tls: needs a server certificate: %w", errdefs.ErrInvalidArgument))
	}
	if c.TLS != nil && c.TLS.ClientCAs == nil {
		errs = append(errs, fmt.Errorf("tunnel.server.tls.clientCAs: needs the agents' CA pool: %w", errdefs.ErrInvalidArgument))
	}
	if c.Authorize == nil {
		errs = append(errs, fmt.Errorf("tunnel.server.authorize: required: %w", errdefs.ErrInvalidArgument))
	}
	if c.HandshakesPerSecond <= 0 {
		errs = append(errs, fmt.Errorf("tunnel.server.handshakesPerSecond: must be > 0: %w", errdefs.ErrInvalidArgument))
	}
	if c.MaxConcurrentHandshakes < 1 {
		errs = append(errs, fmt.Errorf("tunnel.server.maxConcurrentHandshakes: must be >= 1: %w", errdefs.ErrInvalidArgument))
	}
	if c.MaxHandshakesPerSource < 1 {
		errs = append(errs, fmt.Errorf("tunnel.server.maxHandshakesPerSource: must be >= 1: %w", errdefs.ErrInvalidArgument))
	}
	if c.QUICRetryThreshold < 1 {
		errs = append(errs, fmt.Errorf("tunnel.server.quicRetryThreshold: must be >= 1: %w", errdefs.ErrInvalidArgument))
	}
	if c.ClientHelloTimeout <= 0 {
		errs = append(errs, fmt.Errorf("tunnel.server.clientHelloTimeout: must be > 0: %w", errdefs.ErrInvalidArgument))
	}
	if c.HandshakeBurst < 1 {
		errs = append(errs, fmt.Errorf("tunnel.server.handshakeBurst: must be >= 1: %w", errdefs.ErrInvalidArgument))
	}
	errs = append(errs, c.Liveness.Validate("tunnel.server."), c.Limits.Validate("tunnel.server."))
	return errors.Join(errs...)
}

// Server accepts agent sessions over QUIC and TLS+yamux on one port.
//
//	NewServer -> Start (listening) -> Stop (stopped; Start again is an error)
type Server struct {
	cfg   ServerConfig
	tls   *tls.Config
	adm   *admission
	log   *slog.Logger
	wg    sync.WaitGroup
	stopC chan struct{}
	// inflight counts connections between accept and verdict; sources
	// counts them per source.
	inflight atomic.Int64
	sources  *sourceCounts

	// mu guards everything below.
	mu       sync.Mutex
	started  bool
	stopped  bool
	ctx      context.Context
	cancel   context.CancelFunc
	tcp      net.Listener
	udp      net.PacketConn
	qtr      *quic.Transport
	ql       *quic.Listener
	sessions map[*session]struct{}
	pending  map[closer]struct{}
}

type closer interface{ Close() error }

// NewServer checks cfg and returns a server that is not listening yet.
func NewServer(cfg ServerConfig) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tunnel server config: %w", err)
	}
	tc := cfg.TLS.Clone()
	tc.MinVersion = tls.VersionTLS13
	tc.ClientAuth = tls.RequireAndVerifyClientCert
	tc.NextProtos = []string{ALPN}
	return &Server{
		cfg: cfg, tls: tc, log: cfg.Logger.With("component", "tunnel.server"),
		adm:      newAdmission(cfg.HandshakesPerSecond, cfg.HandshakeBurst, cfg.Clock.Now()),
		sources:  newSourceCounts(cfg.MaxHandshakesPerSource),
		stopC:    make(chan struct{}),
		sessions: make(map[*session]struct{}),
		pending:  make(map[closer]struct{}),
	}, nil
}

// Start binds TCP and UDP on the configured port and returns once both
// accept. Sockets are created on the calling goroutine (tests rely on that
// to listen inside a network namespace).
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return fmt.Errorf("tunnel server on %s: already started: %w", s.cfg.Addr, errdefs.ErrFailedPrecondition)
	}
	tcp, udp, err := listenBoth(s.cfg.Addr)
	if err != nil {
		return err
	}
	// The server has no dial to fail fast: a refused send is a lost one
	// from the start.
	udp, _ = tolerateRefusals(udp, s.cfg.Metrics.udpRefused.WithLabelValues("server"), true)
	qtr := &quic.Transport{Conn: udp, ConnContext: s.quicConnContext, VerifySourceAddress: s.needsRetry}
	if k := s.cfg.QUICStatelessResetKey; k != nil {
		rk := quic.StatelessResetKey(*k)
		qtr.StatelessResetKey = &rk
	}
	ql, err := qtr.Listen(s.tls, quicConfig(s.cfg.Liveness, s.cfg.Limits))
	if err != nil {
		_ = tcp.Close()
		_ = udp.Close()
		return fmt.Errorf("tunnel server: QUIC listen on %s: %w", udp.LocalAddr(), err)
	}
	s.started = true
	s.tcp, s.udp, s.qtr, s.ql = tcp, udp, qtr, ql
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s.wg.Add(1 + quicAcceptors)
	go s.acceptTCP(s.ctx)
	for range quicAcceptors {
		go s.acceptQUIC(s.ctx)
	}
	s.log.Info("tunnel server listening", "tcp", tcp.Addr().String(), "udp", udp.LocalAddr().String())
	return nil
}

func listenBoth(addr string) (net.Listener, net.PacketConn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("tunnel.server.addr %q: %w", addr, errors.Join(err, errdefs.ErrInvalidArgument))
	}
	var lastErr error
	for range 20 {
		tcp, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("tunnel server: listening on tcp %s: %w", addr, err)
		}
		_, p, _ := net.SplitHostPort(tcp.Addr().String())
		udp, err := net.ListenPacket("udp", net.JoinHostPort(host, p))
		if err == nil {
			return tcp, udp, nil
		}
		_ = tcp.Close()
		lastErr = err
		if port != "0" {
			break
		}
	}
	return nil, nil, fmt.Errorf("tunnel server: listening on udp %s: %w", addr, lastErr)
}

// Addr returns the bound TCP address (UDP has the same port); nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tcp == nil {
		return nil
	}
	return s.tcp.Addr()
}

// Stop closes the listeners and every session and waits for all goroutines.
// Safe twice and before Start.
func (s *Server) Stop() {
	s.mu.Lock()
	if s.stopped || !s.started {
		s.stopped = true
		s.mu.Unlock()
		return
	}
	s.stopped = true
	close(s.stopC)
	s.cancel()
	_ = s.tcp.Close()
	_ = s.ql.Close()
	for c := range s.pending {
		_ = c.Close()
	}
	sessions := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	// Sessions first, while the UDP socket still carries their
	// CONNECTION_CLOSE: agents then reconnect at once instead of waiting
	// out the heartbeat timeout.
	for _, ss := range sessions {
		_ = ss.Close()
	}
	_ = s.qtr.Close()
	_ = s.udp.Close()
	s.wg.Wait()
}

// InflightHandshakesForTest returns how many handshake slots are taken.
func (s *Server) InflightHandshakesForTest() int { return int(s.inflight.Load()) }

// SessionsForTest returns the number of admitted sessions.
func (s *Server) SessionsForTest() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

func (s *Server) acceptTCP(ctx context.Context) {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				s.log.Error("tunnel server: tcp accept", "err", err)
			}
			return
		}
		slot, why := s.takeSlot(c.RemoteAddr())
		if slot == nil {
			s.wg.Go(func() { s.refuseBusy(c, s.busyHint(why)) })
			continue
		}
		if !s.addPending(c) {
			slot.release()
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.removePending(c)
			s.handleTCP(ctx, c, slot)
		}()
	}
}

// quicAcceptors drain quic-go's accept queue. It holds 32 connections whose
// handshake is complete and refuses more with CONNECTION_REFUSED, wasting
// the handshake: during a reconnect storm on a loaded machine one goroutine
// is not scheduled often enough to keep it from filling.
const quicAcceptors = 4

func (s *Server) acceptQUIC(ctx context.Context) {
	defer s.wg.Done()
	for {
		c, err := s.ql.Accept(ctx)
		if err != nil {
			return
		}
		qc := quicCloser{c}
		if !s.addPending(qc) {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.removePending(qc)
			slot, _ := c.Context().Value(slotKey{}).(*handshakeSlot)
			s.admit(ctx, &quicMux{c: c}, slot)
		}()
	}
}

type quicCloser struct{ c *quic.Conn }

func (q quicCloser) Close() error { return q.c.CloseWithError(0, "server stopping") }

func (s *Server) addPending(c closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		_ = c.Close()
		return false
	}
	s.pending[c] = struct{}{}
	return true
}

func (s *Server) removePending(c closer) {
	s.mu.Lock()
	delete(s.pending, c)
	s.mu.Unlock()
}

// quicConnContext runs before any crypto of a new QUIC connection (and
// after a Retry, when needsRetry asked for one): over a handshake cap it
// refuses the connection; otherwise the slot is released at the verdict or
// when the handshake fails.
func (s *Server) quicConnContext(ctx context.Context, ci *quic.ClientInfo) (context.Context, error) {
	slot, why := s.takeSlot(ci.RemoteAddr)
	if slot == nil {
		return nil, s.refusedErr(ci.RemoteAddr, why)
	}
	context.AfterFunc(ctx, slot.release)
	return context.WithValue(ctx, slotKey{}, slot), nil
}

func (s *Server) handleTCP(ctx context.Context, c net.Conn, slot *handshakeSlot) {
	defer slot.release()
	hctx, cancel := context.WithTimeout(ctx, s.cfg.Liveness.HandshakeTimeout)
	defer cancel()
	hello, err := readClientHello(c, min(s.cfg.ClientHelloTimeout, s.cfg.Liveness.HandshakeTimeout))
	if err != nil {
		s.handshakeFailed(c.RemoteAddr(), TransportTCP, err)
		_ = c.Close()
		return
	}
	tc := tls.Server(&prefixConn{Conn: c, prefix: hello}, s.tls)
	err = tc.HandshakeContext(hctx)
	// admit serves the session for as long as it lasts: the handshake's
	// context and timer must not stay with it.
	cancel()
	if err != nil {
		s.handshakeFailed(c.RemoteAddr(), TransportTCP, fmt.Errorf("TLS handshake: %w", err))
		_ = c.Close()
		return
	}
	m, err := newYamux(tc, true, s.cfg.Liveness, s.cfg.Limits, s.log)
	if err != nil {
		s.handshakeFailed(c.RemoteAddr(), TransportTCP, err)
		_ = c.Close()
		return
	}
	s.admit(ctx, m, slot)
}

// refuseBusy tells an agent over the handshake cap when to come back: a
// few bytes, no crypto. The ClientHello is drained before closing, as
// closing over unread data would send a RST that can overtake the hint.
func (s *Server) refuseBusy(c net.Conn, hint time.Duration) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write(encodeBusy(hint)); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

func (s *Server) handshakeFailed(remote net.Addr, tr Transport, err error) {
	if abandoned(err) {
		s.cfg.Metrics.handshakes.WithLabelValues("server", resultAbandoned).Inc()
		s.log.Info("tunnel handshake abandoned by the agent", "remote", remote.String(), "transport", string(tr), "err", err)
		return
	}
	s.cfg.Metrics.handshakes.WithLabelValues("server", resultFailed).Inc()
	s.log.Info("tunnel handshake failed, closing that connection", "remote", remote.String(), "transport", string(tr), "err", err)
}

// abandoned reports whether the agent hung up during the handshake (closed
// or reset the TCP connection, or closed the QUIC connection itself).
func abandoned(err error) bool {
	var ae *quic.ApplicationError
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || (errors.As(err, &ae) && ae.Remote)
}

// admit runs the tunnel hello on a TLS-verified mux, applies admission and
// authorization, and serves the session. Only then are the peer's streams
// accepted by anyone.
func (s *Server) admit(ctx context.Context, m mux, slot *handshakeSlot) {
	defer slot.release()
	hctx, cancel := context.WithTimeout(ctx, s.cfg.Liveness.HandshakeTimeout)
	deadline, _ := hctx.Deadline()
	ctrl, err := m.accept(hctx)
	if err == nil {
		_ = ctrl.SetDeadline(deadline)
		err = readHello(ctrl)
	}
	cancel()
	if err != nil {
		s.handshakeFailed(m.remoteAddr(), m.transport(), err)
		_ = m.closeWith("bad hello")
		return
	}
	cert := peerCert(m.tlsState())
	refuse := func(v verdict, logMsg string, err error) {
		s.cfg.Metrics.handshakes.WithLabelValues("server", resultRefused).Inc()
		s.log.Info(logMsg, "remote", m.remoteAddr().String(), "transport", string(m.transport()), "subject", cert.Subject.CommonName, "err", err, "retry_after", v.retryAfter)
		_, _ = ctrl.Write(v.encode())
		// Let the verdict reach the agent before the connection goes.
		_ = ctrl.Close()
		t := s.cfg.Clock.NewTimer(200 * time.Millisecond)
		select {
		case <-m.done():
		case <-t.C():
		case <-ctx.Done():
		}
		t.Stop()
		_ = m.closeWith(v.reason)
	}
	if ok, wait := s.adm.admit(s.cfg.Clock.Now()); !ok {
		refuse(verdict{status: verdictRetry, retryAfter: wait, reason: "handshake rate limit"}, "tunnel refused: admission limit", nil)
		return
	}
	actx, cancel := context.WithTimeout(ctx, s.cfg.Liveness.HandshakeTimeout)
	identity, err := s.cfg.Authorize(actx, cert)
	cancel()
	if err != nil {
		v := verdict{status: verdictPermanent, reason: "certificate not authorized"}
		if errdefs.IsRetryable(err) {
			v = verdict{status: verdictRetry, retryAfter: 5 * time.Second, reason: "authorization unavailable"}
		}
		refuse(v, "tunnel refused by authorizer", err)
		return
	}
	if _, err := ctrl.Write(verdict{status: verdictAdmitted}.encode()); err != nil {
		s.handshakeFailed(m.remoteAddr(), m.transport(), fmt.Errorf("writing verdict to %s: %w", identity, err))
		_ = m.closeWith("verdict failed")
		return
	}
	_ = ctrl.SetDeadline(time.Time{})
	slot.release()
	s.cfg.Metrics.handshakes.WithLabelValues("server", resultOK).Inc()
	ss := newSession(m, "server", identity, ctrl, s.cfg.Liveness, s.cfg.Limits, s.log, s.cfg.Metrics, s.cfg.Clock)
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		_ = ss.Close()
		return
	}
	s.sessions[ss] = struct{}{}
	s.mu.Unlock()
	ss.log.Info("tunnel session admitted")
	if s.cfg.OnSession != nil {
		s.cfg.OnSession(ctx, ss)
	} else {
		<-ss.Done()
	}
	_ = ss.Close()
	s.mu.Lock()
	delete(s.sessions, ss)
	s.mu.Unlock()
}
