package tunnel

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/levers9/levers9/internal/clock"
)

// session implements Session over a mux and its control stream.
type session struct {
	m        mux
	side     string
	identity string
	cert     *x509.Certificate
	ctrl     net.Conn
	live     Liveness
	lim      Limits
	log      *slog.Logger
	metrics  *Metrics
	rx, tx   prometheus.Counter
	addr     *Addr
	doneCh   chan struct{}
	// quiet (client side only) is closed once nothing has arrived on the
	// control stream for quietAfter: the controlplane may have restarted
	// without the reset reaching us, and Auto dials a new session rather
	// than wait out HeartbeatTimeout.
	quiet chan struct{}
	// polled: the peer's heartbeats are read at each beat instead of by a
	// goroutine of their own (see pollsHeartbeats); heard is when one last
	// arrived, touched only by beat.
	polled bool
	heard  time.Time
	wg     sync.WaitGroup

	// mu guards err, closed, streams and hb.
	mu      sync.Mutex
	hb      clock.Timer
	err     error
	closed  bool
	streams map[*countedStream]struct{}
}

var _ Session = (*session)(nil)

func newSession(m mux, side, identity string, ctrl net.Conn, live Liveness, lim Limits, log *slog.Logger, metrics *Metrics, clk clock.Clock) *session {
	s := &session{
		m: m, side: side, identity: identity, ctrl: ctrl, live: live, lim: lim,
		cert:    peerCert(m.tlsState()),
		log:     log.With("identity", identity, "transport", string(m.transport()), "remote", m.remoteAddr().String()),
		metrics: metrics,
		rx:      metrics.bytes.WithLabelValues(side, "rx"),
		tx:      metrics.bytes.WithLabelValues(side, "tx"),
		addr:    &Addr{Identity: identity, Transport: m.transport(), Remote: m.remoteAddr()},
		doneCh:  make(chan struct{}),
		streams: make(map[*countedStream]struct{}),
	}
	if side == "client" && live.quietAfter() < live.HeartbeatTimeout {
		s.quiet = make(chan struct{})
	}
	metrics.sessions.WithLabelValues(side, string(m.transport())).Inc()
	if ctx, ok := pollsHeartbeats(side, m); ok {
		s.polled, s.heard = true, time.Now()
		if ctx != nil {
			context.AfterFunc(ctx, func() {
				s.fail(fmt.Errorf("session with %s ended: %w", s.identity, context.Cause(ctx)))
			})
		}
	} else {
		s.wg.Add(1)
		go s.readHeartbeats()
	}
	// Heartbeats are written from a timer, not a goroutine of their own:
	// an idle agent costs one goroutine less.
	s.mu.Lock()
	s.hb = clk.AfterFunc(live.HeartbeatInterval, s.beat)
	s.mu.Unlock()
	return s
}

// pollsHeartbeats says whether a session reads its peer's heartbeats at
// each beat rather than from a goroutine of its own; for QUIC it also
// returns the context that ends with the connection. The server's side
// does: a controlplane holds thousands of sessions. QUIC tells a closed
// connection (CONNECTION_CLOSE, stateless reset, idle timeout) on that
// context at once; a closed yamux session fails the next beat's write, and
// the Hub's accept loop sees it at once. The client keeps its reader: it
// acts on a quiet controlplane within quietAfter.
func pollsHeartbeats(side string, m mux) (context.Context, bool) {
	if side != "server" {
		return nil, false
	}
	if q, ok := m.(*quicMux); ok {
		return q.c.Context(), true
	}
	return nil, true
}

// heartbeatPollWait is how long a beat waits for the peer's heartbeat
// when none is buffered (the peer beats at the same interval, so one
// usually is): short, as it holds the timer's goroutine.
const heartbeatPollWait = time.Millisecond

// drainHeartbeats reads what the peer sent since the last beat. It fails
// on anything but heartbeats and on HeartbeatTimeout of silence: checked
// at each beat, so the session ends within one interval of the timeout
// (QUIC's idle timeout, HeartbeatTimeout plus an interval, is the same
// bound).
func (s *session) drainHeartbeats() error {
	var buf [4 * heartbeatLen]byte
	_ = s.ctrl.SetReadDeadline(time.Now().Add(heartbeatPollWait))
	for {
		n, err := s.ctrl.Read(buf[:])
		if n > 0 {
			s.heard = time.Now()
		}
		if err := s.heartbeatsOnly(buf[:n]); err != nil {
			return err
		}
		var ne net.Error
		switch {
		case err == nil && n == len(buf):
			continue // more may be buffered
		case err == nil, errors.As(err, &ne) && ne.Timeout():
			if silent := time.Since(s.heard); silent > s.live.HeartbeatTimeout {
				return fmt.Errorf("session with %s: nothing for %s: %w", s.identity, silent.Round(time.Millisecond), ErrPeerDead)
			}
			return nil
		default:
			return fmt.Errorf("session with %s ended: %w", s.identity, err)
		}
	}
}

// heartbeatsOnly fails on anything the peer sent on the control stream
// that is not a heartbeat.
func (s *session) heartbeatsOnly(b []byte) error {
	for _, c := range b {
		if c != heartbeatByte {
			return fmt.Errorf("control stream: unexpected byte 0x%02x from %s", c, s.identity)
		}
	}
	return nil
}

func (s *session) readHeartbeats() {
	defer s.wg.Done()
	buf := make([]byte, 64)
	// Connection deadlines are wall-clock instants (the kernel and quic-go
	// read them), so they come from time.Now, not the Clock.
	last := time.Now()
	quiet := s.quiet
	for {
		deadline := last.Add(s.live.HeartbeatTimeout)
		if quiet != nil {
			deadline = last.Add(s.live.quietAfter())
		}
		_ = s.ctrl.SetReadDeadline(deadline)
		n, err := s.ctrl.Read(buf)
		if n > 0 {
			last = time.Now()
		}
		if err := s.heartbeatsOnly(buf[:n]); err != nil {
			s.fail(err)
			return
		}
		if err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout() && quiet != nil:
				// Keep the session until HeartbeatTimeout; Auto
				// tries a new one meanwhile.
				if n == 0 {
					s.log.Info("no heartbeat from the peer", "for", time.Since(last).Round(time.Millisecond))
					close(quiet)
					quiet = nil
				}
				continue
			case errors.As(err, &ne) && ne.Timeout():
				s.fail(fmt.Errorf("session with %s: %w", s.identity, ErrPeerDead))
			default:
				s.fail(fmt.Errorf("session with %s ended: %w", s.identity, err))
			}
			return
		}
	}
}

// Quiet is closed once nothing arrived from the controlplane for about
// two heartbeat intervals (nil on the server side: it never redials).
func (s *session) Quiet() <-chan struct{} { return s.quiet }

var heartbeat = [heartbeatLen]byte(bytes.Repeat([]byte{heartbeatByte}, heartbeatLen))

// beat writes one heartbeat and schedules the next.
func (s *session) beat() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	_ = s.ctrl.SetWriteDeadline(time.Now().Add(s.live.HeartbeatTimeout))
	if _, err := s.ctrl.Write(heartbeat[:]); err != nil {
		s.fail(fmt.Errorf("writing heartbeat to %s: %w", s.identity, err))
		return
	}
	if s.polled {
		if err := s.drainHeartbeats(); err != nil {
			s.fail(err)
			return
		}
	}
	s.mu.Lock()
	if !s.closed {
		s.hb.Reset(s.live.HeartbeatInterval)
	}
	s.mu.Unlock()
}

// fail ends the session once, recording why.
func (s *session) fail(err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.err = err
	if s.hb != nil {
		s.hb.Stop()
	}
	streams := s.streams
	s.streams = nil
	s.mu.Unlock()

	close(s.doneCh)
	if errors.Is(err, ErrClosed) {
		s.log.Debug("tunnel session closed")
	} else {
		s.log.Info("tunnel session ended", "err", err)
	}
	_ = s.ctrl.Close()
	_ = s.m.closeWith(err.Error())
	for c := range streams {
		_ = c.Conn.Close()
		s.metrics.streamsClosed.WithLabelValues(s.side).Inc()
	}
	s.metrics.sessions.WithLabelValues(s.side, string(s.m.transport())).Dec()
}

func (s *session) track(c net.Conn) (net.Conn, error) {
	cs := &countedStream{Conn: c, s: s, rx: s.rx, tx: s.tx, addr: s.addr}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return nil, s.errLocked()
	}
	if len(s.streams) >= s.lim.MaxStreams {
		_ = c.Close()
		return nil, fmt.Errorf("session with %s has %d streams: %w", s.identity, len(s.streams), ErrTooManyStreams)
	}
	s.streams[cs] = struct{}{}
	s.metrics.streamsOpened.WithLabelValues(s.side).Inc()
	return cs, nil
}

func (s *session) streamClosed(c *countedStream) {
	s.mu.Lock()
	_, ok := s.streams[c]
	delete(s.streams, c)
	s.mu.Unlock()
	if ok {
		s.metrics.streamsClosed.WithLabelValues(s.side).Inc()
	}
}

func (s *session) errLocked() error {
	if s.err != nil {
		return s.err
	}
	return ErrClosed
}

func (s *session) OpenStream(ctx context.Context) (net.Conn, error) {
	select {
	case <-s.doneCh:
		return nil, s.Err()
	default:
	}
	c, err := s.m.open(ctx)
	if err != nil {
		if e := s.Err(); e != nil {
			return nil, fmt.Errorf("opening stream to %s: %w", s.identity, e)
		}
		return nil, fmt.Errorf("opening stream to %s: %w", s.identity, err)
	}
	return s.track(c)
}

// AcceptStream returns the next stream the peer opened. Streams over
// MaxStreams are reset with a log line and skipped.
func (s *session) AcceptStream(ctx context.Context) (net.Conn, error) {
	for {
		c, err := s.m.accept(ctx)
		if err != nil {
			if e := s.Err(); e != nil {
				return nil, fmt.Errorf("accepting stream from %s: %w", s.identity, e)
			}
			return nil, fmt.Errorf("accepting stream from %s: %w", s.identity, err)
		}
		tc, err := s.track(c)
		if errors.Is(err, ErrTooManyStreams) {
			s.log.Warn("refusing stream over the limit", "max_streams", s.lim.MaxStreams)
			continue
		}
		return tc, err
	}
}

func (s *session) Close() error {
	s.fail(ErrClosed)
	s.wg.Wait()
	return nil
}

func (s *session) Done() <-chan struct{} { return s.doneCh }

func (s *session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		return nil
	}
	return s.errLocked()
}

func (s *session) Identity() string                   { return s.identity }
func (s *session) PeerCertificate() *x509.Certificate { return s.cert }
func (s *session) Transport() Transport               { return s.m.transport() }
func (s *session) LocalAddr() net.Addr                { return s.m.localAddr() }
func (s *session) RemoteAddr() net.Addr               { return s.m.remoteAddr() }

// OpenStreamsForTest returns how many streams the session tracks as open.
func (s *session) OpenStreamsForTest() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}
