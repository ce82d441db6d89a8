package tunnel

import (
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// countedStream counts bytes and keeps the session's open-stream count and
// the opened/closed counters balanced: Close runs its bookkeeping once, and
// a session end closes every stream still open.
type countedStream struct {
	net.Conn
	s      *session
	rx, tx prometheus.Counter
	addr   *Addr
	once   sync.Once
}

func (c *countedStream) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.rx.Add(float64(n))
	}
	return n, err
}

func (c *countedStream) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.tx.Add(float64(n))
	}
	return n, err
}

func (c *countedStream) RemoteAddr() net.Addr { return c.addr }

func (c *countedStream) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.s.streamClosed(c) })
	return err
}
