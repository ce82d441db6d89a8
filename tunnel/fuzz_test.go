package tunnel

import (
	"bytes"
	"context"
	"crypto/x509"
	"io"
	"net"
	"testing"
	"time"

	"github.com/levers9/levers9/tunnel/tunneltest"
)

func FuzzReadHelloAndVerdict(f *testing.F) {
	f.Add(helloMagic[:])
	f.Add(verdict{status: verdictRetry, retryAfter: 1500 * time.Millisecond, reason: "rate"}.encode())
	f.Add(verdict{status: verdictPermanent, reason: "revoked"}.encode())
	f.Add([]byte{0, 0, 0, 0, 0, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := readHello(bytes.NewReader(b)); err == nil && !bytes.HasPrefix(b, helloMagic[:]) {
			t.Fatalf("hello %q accepted", b)
		}
		v, err := readVerdict(bytes.NewReader(b))
		if err != nil {
			return
		}
		// What parses re-encodes to the same prefix.
		if enc := v.encode(); !bytes.HasPrefix(b, enc) {
			t.Fatalf("verdict %q re-encoded as %q", b, enc)
		}
	})
}

// FuzzServerFirstBytes feeds arbitrary first bytes to the server's real TCP
// handshake path: it must give up within the handshake timeout, never admit
// a session and never panic.
func FuzzServerFirstBytes(f *testing.F) {
	ca, err := tunneltest.NewCA("fuzz")
	if err != nil {
		f.Fatal(err)
	}
	stls, err := ca.ServerTLS()
	if err != nil {
		f.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{
		Addr: "127.0.0.1:0", TLS: stls,
		Authorize: func(context.Context, *x509.Certificate) (string, error) { return "fuzz", nil },
		Liveness:  Liveness{HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: 200 * time.Millisecond, HandshakeTimeout: 100 * time.Millisecond},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte{})
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 1, 0, 0, 1, 0})
	f.Add([]byte{0x16, 0x03, 0x01, 0xff, 0xff})
	f.Add(append([]byte{0x16, 0x03, 0x03, 0x00, 0x30}, bytes.Repeat([]byte{0x01}, 48)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.handleTCP(context.Background(), server, nil)
		}()
		go func() {
			_, _ = client.Write(b)
			_, _ = io.Copy(io.Discard, client)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("server handshake did not give up")
		}
		_ = client.Close()
		if len(srv.sessions) != 0 {
			t.Fatal("garbage admitted a session")
		}
	})
}
