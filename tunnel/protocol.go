package tunnel

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// The control stream is the first stream the agent opens. Its framing:
//
//	agent  -> server: hello   = "L9T" version(1)
//	server -> agent:  verdict = status(1) retryAfterMillis(4, BE) reasonLen(2, BE) reason
//	then both ways:   heartbeats, heartbeatLen bytes of 'h' per HeartbeatInterval
//
//	status: 0 admitted, 1 refused (retry later), 2 refused (permanent)
//
// Over TCP a server with too many handshakes in flight answers before any
// crypto with a busy record instead of a TLS ServerHello:
//
//	busy = "L9B" retryAfter(2, BE, units of 10 ms)
//
// A TLS client reports it as a tls.RecordHeaderError carrying those 5
// bytes, so the agent learns the hint without the server spending a
// handshake. It is not authenticated: its only power is a bounded delay,
// which anyone on the path has anyway by dropping packets.

var helloMagic = [4]byte{'L', '9', 'T', 1}

const (
	verdictAdmitted  byte = 0
	verdictRetry     byte = 1
	verdictPermanent byte = 2

	heartbeatByte byte = 'h'
	// heartbeatLen makes a heartbeat's QUIC packet longer than the 42 bytes
	// under which quic-go sends no stateless reset: a restarted controlplane
	// then resets an agent's old connection at its next heartbeat, instead
	// of the agent waiting out HeartbeatTimeout.
	heartbeatLen = 32

	maxReasonLen = 512
)

var busyMagic = [3]byte{'L', '9', 'B'}

const busyUnit = 10 * time.Millisecond

func encodeBusy(retryAfter time.Duration) []byte {
	u := min(max(retryAfter/busyUnit, 1), maxRetryAfter/busyUnit)
	return []byte{busyMagic[0], busyMagic[1], busyMagic[2], byte(u >> 8), byte(u)}
}

// busyRefusal turns a TLS client handshake error into the server's busy
// refusal when it carried one.
func busyRefusal(err error) (*RefusedError, bool) {
	var rh tls.RecordHeaderError
	if !errors.As(err, &rh) || [3]byte(rh.RecordHeader[:3]) != busyMagic {
		return nil, false
	}
	u := time.Duration(binary.BigEndian.Uint16(rh.RecordHeader[3:5]))
	return &RefusedError{Reason: "controlplane busy: too many handshakes in flight", RetryAfter: min(u*busyUnit, maxRetryAfter)}, true
}

// readHello reads and checks the agent's hello.
func readHello(r io.Reader) error {
	var b [4]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return fmt.Errorf("reading tunnel hello: %w", err)
	}
	if b != helloMagic {
		return fmt.Errorf("tunnel hello: bad magic/version %q: %w", b[:], errdefs.ErrInvalidArgument)
	}
	return nil
}

type verdict struct {
	status     byte
	retryAfter time.Duration
	reason     string
}

// maxWireRetryAfter bounds the retry-after hint on the wire: a longer one
// is a broken or hostile server, and an agent must not sleep for weeks on it.
const maxWireRetryAfter = time.Hour

func (v verdict) encode() []byte {
	reason := v.reason
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	ms := v.retryAfter.Milliseconds()
	if ms < 0 {
		ms = 0
	}
	if ms > maxWireRetryAfter.Milliseconds() {
		ms = maxWireRetryAfter.Milliseconds()
	}
	b := make([]byte, 7+len(reason))
	b[0] = v.status
	binary.BigEndian.PutUint32(b[1:5], uint32(ms))
	binary.BigEndian.PutUint16(b[5:7], uint16(len(reason)))
	copy(b[7:], reason)
	return b
}

// readVerdict reads the server's answer to the hello.
func readVerdict(r io.Reader) (verdict, error) {
	var h [7]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return verdict{}, fmt.Errorf("reading tunnel verdict: %w", err)
	}
	v := verdict{status: h[0], retryAfter: time.Duration(binary.BigEndian.Uint32(h[1:5])) * time.Millisecond}
	if v.status > verdictPermanent {
		return verdict{}, fmt.Errorf("tunnel verdict: unknown status %d: %w", v.status, errdefs.ErrInvalidArgument)
	}
	if v.retryAfter > maxWireRetryAfter {
		return verdict{}, fmt.Errorf("tunnel verdict: retry-after %v over %v: %w", v.retryAfter, maxWireRetryAfter, errdefs.ErrInvalidArgument)
	}
	n := binary.BigEndian.Uint16(h[5:7])
	if n > maxReasonLen {
		return verdict{}, fmt.Errorf("tunnel verdict: reason length %d over %d: %w", n, maxReasonLen, errdefs.ErrInvalidArgument)
	}
	reason := make([]byte, n)
	if _, err := io.ReadFull(r, reason); err != nil {
		return verdict{}, fmt.Errorf("reading tunnel verdict reason: %w", err)
	}
	v.reason = string(reason)
	return v, nil
}

func (v verdict) err() error {
	switch v.status {
	case verdictAdmitted:
		return nil
	case verdictPermanent:
		return &RefusedError{Reason: v.reason, Permanent: true}
	default:
		return &RefusedError{Reason: v.reason, RetryAfter: v.retryAfter}
	}
}
