package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/clientconfig"
	"github.com/levers9/levers9/internal/clock"
)

// Options are what New takes besides the config.
type Options struct {
	Logger *slog.Logger
	// Clock is the wall clock unless a test passes a fake.
	Clock clock.Clock
	// Getenv is consulted for the CLI's TLS variables when dialing
	// (LEVERS9_CONTROLPLANE_TLS, LEVERS9_CONTROLPLANE_CA); an empty
	// environment when nil.
	Getenv func(string) string
}

// Server is the dashboard API. Start serves it, Stop ends it.
type Server struct {
	cfg    *Config
	log    *slog.Logger
	clock  clock.Clock
	signer *signer
	oidc   *oidcClient
	conn   *grpc.ClientConn

	tasks    v1.TaskServiceClient
	machines v1.MachineServiceClient
	pools    v1.PoolServiceClient
	tokens   v1.TokenServiceClient
	secrets  v1.SecretServiceClient
	security v1.SecurityServiceClient
	health   healthpb.HealthClient

	metrics *metrics
	handler http.Handler
	// patterns are the guarded routes, for the authorization test.
	patterns []string

	// mu guards the listener state below.
	mu       sync.Mutex
	srv      *http.Server
	ln       net.Listener
	done     chan struct{}
	stopOnce sync.Once
}

// New dials the controlplane (lazily) and builds the routes. The OIDC
// provider is discovered on the first sign-in, so a slow provider never
// stops the API from starting.
func New(cfg *Config, opts Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real()
	}
	if opts.Getenv == nil {
		opts.Getenv = func(string) string { return "" }
	}
	conn, err := clientconfig.Dial(clientconfig.Context{Controlplane: cfg.Controlplane, TLS: cfg.ControlplaneTLS, CAFile: cfg.ControlplaneCA}, opts.Getenv)
	if err != nil {
		return nil, fmt.Errorf("dial the controlplane: %w", err)
	}
	s := &Server{
		cfg: cfg, log: opts.Logger.With("component", "dashboard-api"), clock: opts.Clock, signer: newSigner(cfg.SessionSecret), conn: conn,
		tasks: v1.NewTaskServiceClient(conn), machines: v1.NewMachineServiceClient(conn), pools: v1.NewPoolServiceClient(conn),
		tokens: v1.NewTokenServiceClient(conn), secrets: v1.NewSecretServiceClient(conn), security: v1.NewSecurityServiceClient(conn),
		health: healthpb.NewHealthClient(conn), metrics: newMetrics(),
	}
	if cfg.GoogleSignIn() {
		s.oidc = newOIDCClient(cfg)
	}
	s.handler = s.routes()
	return s, nil
}

// Handler is the API's whole HTTP handler (tests serve it themselves).
func (s *Server) Handler() http.Handler { return s.handler }

// Start listens on cfg.Addr and serves in the background; it returns once
// the listener is open. Addr reports the address taken.
func (s *Server) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return errors.New("dashboard API already started")
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Addr, err)
	}
	if s.cfg.DevSignIn {
		s.log.Warn("development sign-in is ON: anyone who reaches this API can sign in as any email; never run it like this in production")
	}
	s.ln = ln
	s.done = make(chan struct{})
	s.srv = &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("dashboard API stopped serving", "err", err)
		}
	}()
	s.log.Info("dashboard API listening", "addr", ln.Addr().String(), "public_url", s.cfg.PublicURL, "web_url", s.cfg.WebURL,
		"google_signin", s.cfg.GoogleSignIn(), "dev_signin", s.cfg.DevSignIn)
	return nil
}

// Addr is the listening address (after Start).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Stop closes the listener and open connections (WebSockets included) and
// the controlplane connection, and waits. Safe twice and before Start.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		srv, done := s.srv, s.done
		s.mu.Unlock()
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.Shutdown(ctx)
			cancel()
			_ = srv.Close()
			<-done
		}
		_ = s.conn.Close()
	})
}

// cp is ctx carrying the dashboard's controlplane token.
func (s *Server) cp(ctx context.Context) context.Context {
	return clientconfig.WithToken(ctx, s.cfg.Token)
}

// access is who may use a route.
type access int

const (
	anyone access = iota
	members
	admins
)

// caller is the signed-in user of a request (nil session: anonymous).
type caller struct {
	sess *session
	role Role
}

type handlerFunc func(w http.ResponseWriter, r *http.Request, c caller)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	handle := func(pattern string, a access, h handlerFunc) {
		s.patterns = append(s.patterns, pattern)
		mux.Handle(pattern, s.guard(pattern, a, h))
	}
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.Handle("GET /metrics", s.metricsHandler())

	handle("GET /api/session", anyone, s.getSession)
	handle("GET /api/auth/google/start", anyone, s.googleStart)
	handle("GET /api/auth/google/callback", anyone, s.googleCallback)
	handle("POST /api/auth/dev", anyone, s.devSignIn)
	handle("POST /api/auth/signout", anyone, s.signOut)

	handle("GET /api/tasks", members, s.listTasks)
	handle("GET /api/tasks/{id}", members, s.getTask)
	handle("POST /api/tasks/{id}/cancel", members, s.cancelTask)
	handle("GET /api/tasks/{id}/logs", members, s.taskLogs)
	handle("GET /api/pools", members, s.listPools)
	handle("GET /api/machines", admins, s.listMachines)
	handle("GET /api/machines/{id}", admins, s.getMachine)
	handle("GET /api/tokens", admins, s.listTokens)
	handle("POST /api/tokens", admins, s.createToken)
	handle("DELETE /api/tokens/{id}", admins, s.revokeToken)
	handle("GET /api/secrets", members, s.listSecrets)
	handle("GET /api/security", admins, s.securityReport)

	handle("GET /api/ws/tasks", members, s.wsTasks)
	handle("GET /api/ws/tasks/{id}", members, s.wsTask)
	handle("GET /api/ws/machines", admins, s.wsMachines)

	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such route: "+r.Method+" "+r.URL.Path)
	})
	return s.common(mux)
}

// common adds the headers every response has and answers CORS preflights
// from the web app's origin.
func (s *Server) common(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "strict-origin-when-cross-origin")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
		h.Set("Cache-Control", "no-store")
		if o := r.Header.Get("Origin"); o != "" && o == s.cfg.webOrigin() && o != s.cfg.publicOrigin() {
			h.Set("Access-Control-Allow-Origin", o)
			h.Set("Access-Control-Allow-Credentials", "true")
			h.Add("Vary", "Origin")
			if r.Method == http.MethodOptions {
				h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE")
				h.Set("Access-Control-Allow-Headers", "Content-Type, "+CSRFHeader)
				h.Set("Access-Control-Max-Age", "600")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// guard checks the session, the role and, on state-changing methods, the
// CSRF token, then counts the request.
func (s *Server) guard(pattern string, a access, h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		defer func() { s.metrics.requests.WithLabelValues(pattern, strconv.Itoa(rec.code)).Inc() }()
		sess := s.sessionOf(r)
		c := caller{sess: sess}
		if sess != nil {
			c.role = s.roleOf(sess.Email)
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !s.csrfOK(r, sess) {
			writeError(rec, http.StatusForbidden, "csrf", "missing or wrong "+CSRFHeader+" header (get the token from GET /api/session)")
			return
		}
		switch {
		case a == anyone:
		case sess == nil:
			writeError(rec, http.StatusUnauthorized, "unauthenticated", "sign in first")
			return
		case a == admins && c.role != RoleAdmin:
			writeError(rec, http.StatusForbidden, "permission_denied", "this needs the admin role, and "+sess.Email+" is a member (LEVERS9_DASHBOARD_ADMINS lists the admins)")
			return
		}
		h(rec, r, c)
	})
}

// statusRecorder remembers the status code for the metrics and keeps
// http.Hijacker reachable for WebSocket upgrades.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	resp, err := s.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "controlplane": "unreachable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "controlplane": "ok"})
}

func (s *Server) metricsHandler() http.Handler {
	h := promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.MetricsToken != "" && !equalSecret(r.Header.Get("Authorization"), "Bearer "+s.cfg.MetricsToken) {
			writeError(w, http.StatusUnauthorized, "unauthenticated", "/metrics needs Authorization: Bearer LEVERS9_DASHBOARD_METRICS_TOKEN")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// metrics are the API's Prometheus series, in a registry of its own.
type metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	websockets *prometheus.GaugeVec
	signins    *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "levers9_dashboard_http_requests_total",
			Help: "API requests by route pattern and status code."}, []string{"route", "code"}),
		websockets: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "levers9_dashboard_websockets_open",
			Help: "Open WebSockets by view."}, []string{"view"}),
		signins: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "levers9_dashboard_signins_total",
			Help: "Sign-in attempts by method (google, dev) and result (ok, refused, error)."}, []string{"method", "result"}),
	}
	m.reg.MustRegister(m.requests, m.websockets, m.signins, collectors.NewGoCollector())
	return m
}

// apiError is the body of every error response.
type apiError struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, apiError{Error: errorBody{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// readJSON decodes a small JSON body, refusing unknown fields.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", "the body is not the JSON this route takes: "+err.Error())
		return false
	}
	return true
}
