// Package tunnel owns levers9's transport between agents and the
// controlplane: a multiplexed, mutually authenticated Session carried over
// QUIC (UDP, TLS 1.3, ALPN "levers9-tunnel/1") or over TLS 1.3 on TCP with
// hashicorp/yamux, and gRPC running both ways over it.
//
// Direction. Agents always dial out; the controlplane never dials in. The
// controlplane's Server listens on one port (":1995" by default) for both UDP
// (QUIC) and TCP (TLS+yamux). Once a session is up either side opens streams:
// the controlplane pushes (gRPC ClientConn whose connections are streams it
// opens on the agent's session, made on the first push and disconnected when
// idle) and the agent calls back (a ClientConn whose
// streams go to the controlplane). The agent has no listening socket.
//
// Identity. The agent presents a client certificate that must chain to the
// server's CA pool; then an injected Authorizer maps it to an identity (a
// machine) or refuses it (unknown, expired, revoked) before any stream is
// served. Overload protection has two stages: at most
// ServerConfig.MaxConcurrentHandshakes connections may be between accept and
// verdict (beyond that a connection is refused before any crypto: over TCP
// with a five-byte busy record carrying a retry-after hint, over QUIC with
// CONNECTION_REFUSED), and admitted handshakes are rate limited by a token bucket
// (HandshakesPerSecond) whose refusals carry a retry-after hint that places
// each refused agent in a virtual queue, so a fleet reconnecting after a
// restart is spread out instead of retrying in lockstep.
//
// The front door. Those handshake slots are not a pool an anonymous sender
// can fill. One source (an IPv4 address or an IPv6 /64) holds at most
// MaxHandshakesPerSource of them (default 64), refused like the global cap
// and counted as "refused_source"; its refusals do not join the virtual
// queue, so an attacker's loop does not lengthen everyone's hint. Sessions
// are not capped per source: a fleet behind one NAT address gets in, that
// many handshakes at a time. Once QUICRetryThreshold handshakes are in
// flight (default half the cap), a new QUIC connection must first answer a
// Retry, proving it receives at its source address, so spoofed Initials
// cost a stateless Retry and no slot. A TCP connection gets
// ClientHelloTimeout (default 3 s) to deliver its whole first TLS record,
// the ClientHello, and is closed otherwise; only then does the rest of
// Liveness.HandshakeTimeout apply, so a slowloris holds a slot for seconds.
// The later stages keep the whole HandshakeTimeout: under load the
// server's own flight is what is slow, and an honest agent must not pay
// for it. Behind a TCP load balancer that hides agents' addresses, raise
// MaxHandshakesPerSource to MaxConcurrentHandshakes.
//
// Dialling. Direct makes one session: a happy-eyeballs race per address,
// QUIC first and TCP after a short head start (longer to an address where
// QUIC won last time), the first to complete wins and the loser is closed; TCP may go through an HTTP CONNECT proxy
// (HTTPS_PROXY). Auto keeps one session up: on loss it redials with
// exponential backoff and full jitter (Config.Backoff*), capped, reset once a
// session stayed up for Config.StableAfter; a refusal's retry-after is
// honoured as a lower bound. While on TCP, Auto probes QUIC every
// Config.ReprobeInterval and moves to it when it works.
//
// Reconnects. A session is never resumed. When it ends (peer dead, network
// change, move from TCP back to QUIC) every open stream on it fails with an
// error, in-flight RPCs fail with codes.Unavailable, and callers retry on the
// next session; gRPC ClientConns created by this package redial on the new
// session by themselves.
//
// Liveness and keepalive. Each side writes a heartbeat on the session's
// control stream every Config.HeartbeatInterval (3 s) and closes the session
// when nothing arrived for Config.HeartbeatTimeout (12 s), so a dead or
// half-open peer is detected within 15 s on both sides and a push to it fails
// instead of hanging. The heartbeat also keeps NAT and load-balancer bindings
// warm (UDP ones often expire after 30 s, TCP ones after 350 s). yamux runs
// with a connection write timeout and a stream close timeout so no write can
// hang; QUIC runs with an idle timeout tied to the heartbeat. Neither runs
// its own keepalive: the heartbeat is one, and an idle agent then costs a
// heartbeat and its acknowledgement each way per interval, nothing more.
// The server reads an agent's heartbeats when it writes its own, not from
// a goroutine per agent: an idle agent costs the controlplane three
// goroutines (two of quic-go's or yamux's, and the gRPC accept loop).
// Both sides must use compatible settings: each side's HeartbeatTimeout must
// exceed the other side's HeartbeatInterval several times over (use the same
// Liveness on both). Reads on application streams have no idle deadline of
// their own (an idle gRPC connection is normal); a dead peer fails them
// through the session ending. A restarted server given the same
// QUICStatelessResetKey resets old QUIC connections at their next packet.
//
// What it must never do: know about tasks, machines' state or any other
// levers9 part (it imports only internal/errdefs and internal/clock, whose
// Clock times its heartbeats, backoff and races); dial from the
// controlplane towards an agent; keep state in package globals; log secrets.
//
// Stability: the API is young and may change while the controlplane and agent
// are wired to it; the wire protocol (ALPN "levers9-tunnel/1" and the control
// stream framing) is versioned by its ALPN.
package tunnel
