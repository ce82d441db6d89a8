package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"sync"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/internal/version"
)

// restHandler serves the REST gateway under /api/, health on /healthz, agent
// downloads, and /metrics only when controlplane.metrics.token is set (then
// behind it). The gateway talks to the in-memory gRPC server, so REST and
// gRPC share every interceptor, authentication included. Every request body
// is held to maxMessageBytes before the gateway decodes it, but the raw
// blob upload's (blobRoute), which streams and is held to the blob limit.
func (s *Server) restHandler(ctx context.Context) (http.Handler, error) {
	conn, err := grpc.NewClient("passthrough:///levers9-internal",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return s.memLn.dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxAnswerBytes)))
	if err != nil {
		return nil, fmt.Errorf("gateway connection: %w", err)
	}
	// The connection lives as long as the in-memory server it dials:
	// stopping that server closes the listener, and the listener closes the
	// connection (its resolver and balancer goroutines leaked otherwise).
	s.memLn.onClose = func() { _ = conn.Close() }
	gw := runtime.NewServeMux(runtime.WithIncomingHeaderMatcher(headerMatcher))
	for _, reg := range []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{
		v1.RegisterAuthServiceHandler,
		v1.RegisterTokenServiceHandler,
		v1.RegisterSecretServiceHandler,
		v1.RegisterRegistryServiceHandler,
		v1.RegisterWorkspaceServiceHandler,
		v1.RegisterPoolServiceHandler,
		v1.RegisterMachineServiceHandler,
		v1.RegisterEnrollServiceHandler,
		v1.RegisterSecurityServiceHandler,
		v1.RegisterTaskServiceHandler,
		v1.RegisterVolumeServiceHandler,
		v1.RegisterImageServiceHandler,
	} {
		if err := reg(ctx, gw, conn); err != nil {
			_ = s.memLn.Close()
			return nil, fmt.Errorf("register REST gateway: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", gw)
	if s.cfg.Controlplane.Metrics.Token != "" {
		mux.Handle("/metrics", s.metricsHandler())
	}
	mux.HandleFunc("/healthz", s.serveHealth)
	mux.Handle("/agent/v1/download/", s.deps.Dist)
	top := http.NewServeMux()
	top.Handle(blobRoute, putBlob(gw, conn, s.deps.Images.BlobLimit()))
	top.Handle("/", limitBody(mux, maxMessageBytes))
	return top, nil
}

// maxMessageBytes bounds a request: gRPC's MaxRecvMsgSize and every REST
// body.
const maxMessageBytes = 4 << 20

// maxAnswerBytes bounds an answer the gateway takes from the gRPC server:
// a GetTaskResult answer carries up to 8 MiB of result (gRPC's default
// would refuse over 4 MiB).
const maxAnswerBytes = 16 << 20

// limitBody refuses a body over max with 413 and a JSON error before next
// sees it: a declared Content-Length at once, a chunked body once max+1
// bytes have arrived. Bodies under the limit are read into memory first,
// so the gateway never decodes from an unbounded stream.
func limitBody(next http.Handler, max int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			tooLarge(w, max)
			return
		}
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			b, err := io.ReadAll(io.LimitReader(r.Body, max+1))
			if int64(len(b)) > max {
				tooLarge(w, max)
				return
			}
			if err != nil {
				writeJSONError(w, http.StatusBadRequest, codes.InvalidArgument, "reading the request body failed")
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			r.ContentLength = int64(len(b))
		}
		next.ServeHTTP(w, r)
	})
}

func tooLarge(w http.ResponseWriter, max int64) {
	// The rest of the body is not read: close the connection after answering.
	w.Header().Set("Connection", "close")
	writeJSONError(w, http.StatusRequestEntityTooLarge, codes.ResourceExhausted,
		fmt.Sprintf("request body larger than %d bytes", max))
}

// writeJSONError answers in the gateway's error shape.
func writeJSONError(w http.ResponseWriter, status int, code codes.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": int(code), "message": msg, "details": []any{}})
}

// headerMatcher forwards the one custom header the API reads (the bootstrap
// secret) besides the gateway's defaults; other Grpc-Metadata- headers are
// dropped so REST callers cannot forge metadata an interceptor might trust.
func headerMatcher(key string) (string, bool) {
	if textproto.CanonicalMIMEHeaderKey(key) == bootstrapRESTHeader {
		return auth.BootstrapHeader, true
	}
	return runtime.DefaultHeaderMatcher(key)
}

const bootstrapRESTHeader = "Grpc-Metadata-X-Levers9-Bootstrap-Secret"

func (s *Server) serveHealth(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	body := map[string]any{"postgres": s.pgUp, "redis": s.redisUp, "migrated": s.migrated}
	healthy := s.migrated && s.pgUp && s.redisUp
	s.mu.Unlock()
	body["healthy"] = healthy
	body["version"] = version.String()
	w.Header().Set("Content-Type", "application/json")
	if !healthy {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}

// memListener is an in-memory net.Listener for the gateway's connection.
type memListener struct {
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
	// onClose, if set before serving starts, runs once when the listener
	// closes (it closes the gateway's connection).
	onClose func()
}

func newMemListener() *memListener {
	return &memListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		if l.onClose != nil {
			l.onClose()
		}
	})
	return nil
}

func (l *memListener) Addr() net.Addr { return memAddr{} }

func (l *memListener) dial() (net.Conn, error) {
	a, b := net.Pipe()
	select {
	case l.conns <- b:
		return a, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

type memAddr struct{}

func (memAddr) Network() string { return "mem" }
func (memAddr) String() string  { return "levers9-internal" }
