package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// ClientConfig configures the agent side (Direct and Auto).
type ClientConfig struct {
	// Addrs are the controlplane's tunnel addresses (host:port), tried in
	// order.
	Addrs []string
	// TLS carries the agent's client certificate and the CA (RootCAs) the
	// controlplane's certificate chains to. TLS 1.3 and the ALPN are forced.
	TLS *tls.Config
	// QUICHeadStart is how long QUIC runs alone before TCP joins the race
	// (default 300 ms). To an address whose last session was QUIC, QUIC
	// gets at least knownQUICHeadStart: after a controlplane restart its
	// handshakes are slow, and a TCP handshake beside each would double
	// the load of the reconnecting fleet.
	QUICHeadStart time.Duration
	// DialTimeout bounds one address's race including the hello (default 10 s).
	DialTimeout time.Duration
	// DisableQUIC and DisableTCP take a transport out of the race.
	DisableQUIC, DisableTCP bool
	// Proxy picks an HTTP CONNECT proxy for TCP (nil: ProxyFromEnvironment).
	// QUIC never goes through a proxy.
	Proxy ProxyFunc
	// DialTCP dials TCP (default net.Dialer); ListenUDP opens the local UDP
	// socket of one QUIC dial (default an ephemeral port). Tests inject
	// versions that create sockets inside a network namespace.
	DialTCP   func(ctx context.Context, network, addr string) (net.Conn, error)
	ListenUDP func(ctx context.Context) (net.PacketConn, error)

	// Auto only: backoff after a lost session or failed dial starts at
	// BackoffBase (1 s), doubles up to BackoffMax (60 s), each wait drawn
	// uniformly in [0, current] (full jitter), and resets once a session
	// stayed up for StableAfter (60 s). While on TCP, QUIC is probed every
	// ReprobeInterval (3 min).
	BackoffBase     time.Duration
	BackoffMax      time.Duration
	StableAfter     time.Duration
	ReprobeInterval time.Duration

	Liveness Liveness
	Limits   Limits
	Logger   *slog.Logger
	Metrics  *Metrics
	// Clock times the race, retries, backoff, reprobes and heartbeats
	// (default the wall clock). Connection deadlines stay on the wall
	// clock, so a test with a fake one must advance it by HeartbeatInterval
	// well within the peer's HeartbeatTimeout or the session dies.
	Clock clock.Clock
}

// WithDefaults fills zero fields.
func (c ClientConfig) WithDefaults() ClientConfig {
	orDefault(&c.QUICHeadStart, 300*time.Millisecond)
	orDefault(&c.DialTimeout, 10*time.Second)
	if c.Proxy == nil {
		c.Proxy = ProxyFromEnvironment()
	}
	if c.DialTCP == nil {
		var d net.Dialer
		c.DialTCP = d.DialContext
	}
	if c.ListenUDP == nil {
		c.ListenUDP = func(context.Context) (net.PacketConn, error) {
			return net.ListenUDP("udp", &net.UDPAddr{})
		}
	}
	orDefault(&c.BackoffBase, time.Second)
	orDefault(&c.BackoffMax, 60*time.Second)
	orDefault(&c.StableAfter, 60*time.Second)
	orDefault(&c.ReprobeInterval, 3*time.Minute)
	sharedDefaults(&c.Liveness, &c.Limits, &c.Logger, &c.Metrics, &c.Clock)
	return c
}

// Validate reports every bad field at once.
func (c ClientConfig) Validate() error {
	var errs []error
	if len(c.Addrs) == 0 {
		errs = append(errs, fmt.Errorf("tunnel.client.addrs: at least one controlplane address: %w", errdefs.ErrInvalidArgument))
	}
	for i, a := range c.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("tunnel.client.addrs[%d] %q: %w", i, a, errors.Join(err, errdefs.ErrInvalidArgument)))
		}
	}
	if c.TLS == nil || len(c.TLS.Certificates) == 0 && c.TLS.GetClientCertificate == nil {
		errs = append(errs, fmt.Errorf("tunnel.client.tls: needs the agent's client certificate: %w", errdefs.ErrInvalidArgument))
	}
	if c.DisableQUIC && c.DisableTCP {
		errs = append(errs, fmt.Errorf("tunnel.client.disableQUIC/disableTCP: both transports disabled: %w", errdefs.ErrInvalidArgument))
	}
	if c.BackoffBase <= 0 || c.BackoffMax < c.BackoffBase {
		errs = append(errs, fmt.Errorf("tunnel.client.backoffBase/backoffMax: need 0 < base <= max, got %s/%s: %w", c.BackoffBase, c.BackoffMax, errdefs.ErrInvalidArgument))
	}
	errs = append(errs, c.Liveness.Validate("tunnel.client."), c.Limits.Validate("tunnel.client."))
	return errors.Join(errs...)
}

// DialMode selects the transports one Dial tries.
type DialMode int

// Dial modes.
const (
	DialRace DialMode = iota // QUIC first, TCP after the head start
	DialQUICOnly
	DialTCPOnly
)

// Direct makes one session per Dial call and nothing else: no goroutines of
// its own, no retries. It is safe for concurrent use.
type Direct struct {
	cfg ClientConfig
	log *slog.Logger

	// mu guards won.
	mu sync.Mutex
	// won is the transport of the last session made to each address.
	won map[string]Transport
}

// knownQUICHeadStart: see ClientConfig.QUICHeadStart. Well under the 10 s
// in which an agent whose UDP became blocked must be on TCP.
const knownQUICHeadStart = 2 * time.Second

func (d *Direct) headStart(addr string) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.won[addr] == TransportQUIC {
		return max(d.cfg.QUICHeadStart, knownQUICHeadStart)
	}
	return d.cfg.QUICHeadStart
}

func (d *Direct) recordWinner(addr string, tr Transport) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.won[addr] = tr
}

// NewDirect checks cfg.
func NewDirect(cfg ClientConfig) (*Direct, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tunnel client config: %w", err)
	}
	return &Direct{cfg: cfg, log: cfg.Logger.With("component", "tunnel.client"), won: make(map[string]Transport)}, nil
}

// Dial tries each address in order and returns the first admitted session.
// A permanent refusal is returned at once (another address shares the same
// authority); otherwise the last error is returned.
func (d *Direct) Dial(ctx context.Context, mode DialMode) (Session, error) {
	var errs []error
	for _, addr := range d.cfg.Addrs {
		s, err := d.dialAddr(ctx, addr, mode)
		if err == nil {
			d.cfg.Metrics.handshakes.WithLabelValues("client", resultOK).Inc()
			return s, nil
		}
		var r *RefusedError
		if errors.As(err, &r) {
			d.cfg.Metrics.handshakes.WithLabelValues("client", resultRefused).Inc()
			return nil, err
		}
		d.cfg.Metrics.handshakes.WithLabelValues("client", resultFailed).Inc()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		errs = append(errs, err)
	}
	return nil, errdefs.WithRetry(fmt.Errorf("dialling controlplane: %w", errors.Join(errs...)), true)
}

type dialResult struct {
	m   mux
	err error
}

func (d *Direct) dialAddr(ctx context.Context, addr string, mode DialMode) (Session, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
	defer cancel()
	useQUIC := !d.cfg.DisableQUIC && mode != DialTCPOnly
	useTCP := !d.cfg.DisableTCP && mode != DialQUICOnly
	if !useQUIC && !useTCP {
		return nil, fmt.Errorf("dialling %s: no transport left for this mode: %w", addr, errdefs.ErrInvalidArgument)
	}
	raceCtx, stopRace := context.WithCancel(ctx)
	defer stopRace()
	results := make(chan dialResult, 2)
	running := 0
	quicFailed := make(chan struct{})
	if useQUIC {
		running++
		go func() {
			m, err := retryLeg(raceCtx, d.cfg.Clock, d.dialQUIC, addr, true)
			var r *RefusedError
			switch {
			case errors.As(err, &r):
				// The server answered over UDP and is busy: a TCP attempt
				// now would only add to its load.
				stopRace()
			case err != nil:
				close(quicFailed)
			}
			results <- dialResult{m, err}
		}()
	}
	if useTCP {
		running++
		go func() {
			if useQUIC {
				t := d.cfg.Clock.NewTimer(d.headStart(addr))
				select {
				case <-t.C():
				case <-quicFailed:
					t.Stop()
				case <-raceCtx.Done():
					t.Stop()
					results <- dialResult{nil, raceCtx.Err()}
					return
				}
			}
			m, err := retryLeg(raceCtx, d.cfg.Clock, d.dialTCP, addr, false)
			results <- dialResult{m, err}
		}()
	}
	var (
		winner mux
		errs   []error
	)
	for ; running > 0; running-- {
		r := <-results
		switch {
		case r.err != nil:
			if !errors.Is(r.err, context.Canceled) || winner == nil {
				errs = append(errs, r.err)
			}
		case winner == nil:
			winner = r.m
			stopRace()
		default:
			_ = r.m.closeWith("lost the race")
		}
	}
	if winner == nil {
		return nil, fmt.Errorf("dialling %s: %w", addr, errors.Join(errs...))
	}
	s, err := d.hello(ctx, addr, winner)
	if err == nil {
		d.recordWinner(addr, s.Transport())
	}
	return s, err
}

// errNoAnswer marks a dial error where the peer never answered (refused,
// unreachable, no handshake reply), as opposed to one that answered badly.
var errNoAnswer = errors.New("no answer")

type noAnswer struct{ err error }

func (e noAnswer) Error() string   { return e.err.Error() }
func (e noAnswer) Unwrap() []error { return []error{e.err, errNoAnswer} }

// retryLeg runs one transport's side of the race until it connects or ctx
// ends. A controlplane that is restarting refuses TCP at once and leaves a
// QUIC Initial unanswered; QUIC only resends it on a doubling probe timer
// (0.3 s, 0.6 s, 1.2 s, ... 4.8 s), so one long attempt would find the
// restarted server seconds late. Fresh attempts (a new Initial each, with a
// doubling per-attempt bound for QUIC so a slow or lossy path still gets
// long ones) bring the agent back soon after the server answers.
// Only a peer that did not answer is tried again; a TLS failure or a
// refusal is an answer and ends the leg at once.
func retryLeg(ctx context.Context, clk clock.Clock, dial func(context.Context, string) (mux, error), addr string, bounded bool) (mux, error) {
	// The first QUIC attempt gets 2 s: an abandoned attempt is not closed
	// (quic-go sends nothing), so on a busy server it holds a handshake
	// slot until the server gives up on it.
	const first, most = time.Second, 4 * time.Second
	step := first
	for {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if bounded {
			actx, cancel = context.WithTimeout(ctx, 2*step)
		}
		start := clk.Now()
		m, err := dial(actx, addr)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, errNoAnswer) {
			return m, err
		}
		// Wait out the rest of a jittered step so a refusing peer is not
		// hammered by agents in lockstep.
		if rest := step/2 + fullJitter(step/2) - clk.Since(start); rest > 0 {
			t := clk.NewTimer(rest)
			select {
			case <-t.C():
			case <-ctx.Done():
				t.Stop()
				return nil, err
			}
		}
		if ctx.Err() != nil {
			return nil, err
		}
		step = min(2*step, most)
	}
}

func (d *Direct) tlsFor(addr string) *tls.Config {
	tc := d.cfg.TLS.Clone()
	tc.MinVersion = tls.VersionTLS13
	tc.NextProtos = []string{ALPN}
	if tc.ServerName == "" {
		host, _, _ := net.SplitHostPort(addr)
		tc.ServerName = host
	}
	return tc
}

// quicBusy: the server refused the connection because it is busy, before
// any crypto (too many handshakes in flight) or after it (quic-go's accept
// queue was full). QUIC carries no hint; Auto backs off with jitter.
func quicBusy() *RefusedError {
	return &RefusedError{Reason: "controlplane busy: QUIC connection refused"}
}

func quicRefused(err error) bool {
	var te *quic.TransportError
	return errors.As(err, &te) && te.Remote && te.ErrorCode == quic.ConnectionRefused
}

func (d *Direct) dialQUIC(ctx context.Context, addr string) (mux, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("quic %s: resolving: %w", addr, err)
	}
	pc, err := d.cfg.ListenUDP(ctx)
	if err != nil {
		return nil, fmt.Errorf("quic %s: local udp socket: %w", addr, err)
	}
	pc, refusals := tolerateRefusals(pc, d.cfg.Metrics.udpRefused.WithLabelValues("client"), false)
	tr := &quic.Transport{Conn: pc}
	c, err := tr.Dial(ctx, ua, d.tlsFor(addr), quicConfig(d.cfg.Liveness, d.cfg.Limits))
	if err == nil && refusals != nil {
		refusals.tolerant.Store(true)
	}
	if err != nil {
		_ = tr.Close()
		_ = pc.Close()
		var (
			hto *quic.HandshakeTimeoutError
			ito *quic.IdleTimeoutError
		)
		switch {
		case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &hto) || errors.As(err, &ito):
			err = noAnswer{err}
		case quicRefused(err):
			err = quicBusy()
		}
		return nil, fmt.Errorf("quic %s: %w", addr, err)
	}
	return &quicMux{c: c, tr: tr}, nil
}

func (d *Direct) dialTCP(ctx context.Context, addr string) (mux, error) {
	proxy, err := d.cfg.Proxy(addr)
	if err != nil {
		return nil, fmt.Errorf("tcp %s: choosing proxy: %w", addr, err)
	}
	var c net.Conn
	if proxy != nil {
		c, err = dialConnect(ctx, d.cfg.DialTCP, proxy, addr)
	} else {
		c, err = d.cfg.DialTCP(ctx, "tcp", addr)
		if err != nil {
			err = noAnswer{err}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("tcp %s: %w", addr, err)
	}
	tc := tls.Client(c, d.tlsFor(addr))
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		if r, ok := busyRefusal(err); ok {
			return nil, r
		}
		return nil, fmt.Errorf("tcp %s: TLS handshake: %w", addr, err)
	}
	m, err := newYamux(tc, false, d.cfg.Liveness, d.cfg.Limits, d.log)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return m, nil
}

// hello opens the control stream and waits for the server's verdict.
func (d *Direct) hello(ctx context.Context, addr string, m mux) (Session, error) {
	deadline, _ := ctx.Deadline()
	ctrl, err := m.open(ctx)
	if err == nil {
		_ = ctrl.SetDeadline(deadline)
		_, err = ctrl.Write(helloMagic[:])
	}
	var v verdict
	if err == nil {
		v, err = readVerdict(ctrl)
	}
	if err == nil {
		err = v.err()
	}
	if err != nil {
		_ = m.closeWith("hello failed")
		var r *RefusedError
		if errors.As(err, &r) {
			return nil, err
		}
		if quicRefused(err) {
			return nil, quicBusy()
		}
		return nil, fmt.Errorf("tunnel hello with %s over %s: %w", addr, m.transport(), err)
	}
	_ = ctrl.SetDeadline(time.Time{})
	identity := addr
	if c := peerCert(m.tlsState()); c != nil && c.Subject.CommonName != "" {
		identity = c.Subject.CommonName
	}
	s := newSession(m, "client", identity, ctrl, d.cfg.Liveness, d.cfg.Limits, d.log, d.cfg.Metrics, d.cfg.Clock)
	s.log.Info("tunnel session up")
	return s, nil
}
