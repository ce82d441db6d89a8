package main

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"github.com/levers9/levers9/tunnel"
	"github.com/levers9/levers9/tunnel/tunneltest"
)

// sinkAck reads a length-prefixed blob and acknowledges it with one byte.
func sinkAck(c net.Conn) {
	defer c.Close()
	var h [8]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return
	}
	if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint64(h[:]))); err != nil {
		return
	}
	_, _ = c.Write([]byte{1})
}

var chunk = make([]byte, 64<<10)

// send writes n bytes (length-prefixed) on c and waits for the ack.
func send(c net.Conn, n int64) error {
	var h [8]byte
	binary.BigEndian.PutUint64(h[:], uint64(n))
	if _, err := c.Write(h[:]); err != nil {
		return err
	}
	for left := n; left > 0; {
		w := min(left, int64(len(chunk)))
		if _, err := c.Write(chunk[:w]); err != nil {
			return err
		}
		left -= w
	}
	var ack [1]byte
	_, err := io.ReadFull(c, ack[:])
	return err
}

// parallel runs streams concurrent sends of total/streams bytes each over
// conns from open and returns MB/s.
func parallel(streams int, total int64, open func() (net.Conn, error)) (float64, error) {
	conns := make([]net.Conn, streams)
	for i := range conns {
		c, err := open()
		if err != nil {
			return 0, err
		}
		conns[i] = c
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := send(c, total/int64(streams)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	for _, c := range conns {
		_ = c.Close()
	}
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(total) / el.Seconds() / 1e6, nil
}

type tputResult struct {
	yamux1, yamux8, quic1, quic8 float64 // ratios to TLS
	tls1, tls8                   float64 // MB/s
}

func measureThroughput(quick bool) (tputResult, error) {
	var r tputResult
	total := int64(256 << 20)
	rounds := 3
	if quick {
		total, rounds = 96<<20, 2
	}
	ca, err := tunneltest.NewCA("bench")
	if err != nil {
		return r, err
	}
	stls, err := ca.ServerTLS()
	if err != nil {
		return r, err
	}
	ctls, err := ca.ClientTLS("bench-agent")
	if err != nil {
		return r, err
	}
	stls.MinVersion = tls.VersionTLS13

	// Baseline: plain TLS 1.3 over TCP, one connection per stream.
	tl, err := tls.Listen("tcp", "127.0.0.1:0", stls)
	if err != nil {
		return r, err
	}
	defer tl.Close()
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go sinkAck(c)
		}
	}()
	bctls := ctls.Clone()
	bctls.MinVersion = tls.VersionTLS13
	openTLS := func() (net.Conn, error) { return tls.Dial("tcp", tl.Addr().String(), bctls) }

	srv, err := tunnel.NewServer(tunnel.ServerConfig{
		Addr: "127.0.0.1:0", TLS: stls,
		Authorize: func(_ context.Context, c *x509Cert) (string, error) { return c.Subject.CommonName, nil },
		OnSession: func(ctx context.Context, s tunnel.Session) {
			for {
				c, err := s.AcceptStream(ctx)
				if err != nil {
					return
				}
				go sinkAck(c)
			}
		},
	})
	if err != nil {
		return r, err
	}
	if err := srv.Start(context.Background()); err != nil {
		return r, err
	}
	defer srv.Stop()
	dial := func(quic bool) (tunnel.Session, error) {
		d, err := tunnel.NewDirect(tunnel.ClientConfig{Addrs: []string{srv.Addr().String()}, TLS: ctls, DisableQUIC: !quic, DisableTCP: quic, Proxy: noProxy})
		if err != nil {
			return nil, err
		}
		return d.Dial(context.Background(), tunnel.DialRace)
	}
	best := func(streams int, open func() (net.Conn, error)) (float64, error) {
		b := 0.0
		for range rounds {
			v, err := parallel(streams, total, open)
			if err != nil {
				return 0, err
			}
			b = math.Max(b, v)
		}
		return b, nil
	}
	if r.tls1, err = best(1, openTLS); err != nil {
		return r, fmt.Errorf("tls x1: %w", err)
	}
	if r.tls8, err = best(8, openTLS); err != nil {
		return r, fmt.Errorf("tls x8: %w", err)
	}
	for _, quic := range []bool{false, true} {
		s, err := dial(quic)
		if err != nil {
			return r, fmt.Errorf("dial quic=%v: %w", quic, err)
		}
		open := func() (net.Conn, error) { return s.OpenStream(context.Background()) }
		v1, err := best(1, open)
		if err != nil {
			return r, fmt.Errorf("tunnel quic=%v x1: %w", quic, err)
		}
		v8, err := best(8, open)
		if err != nil {
			return r, fmt.Errorf("tunnel quic=%v x8: %w", quic, err)
		}
		_ = s.Close()
		if quic {
			r.quic1, r.quic8 = v1/r.tls1, v8/r.tls8
		} else {
			r.yamux1, r.yamux8 = v1/r.tls1, v8/r.tls8
		}
	}
	return r, nil
}
