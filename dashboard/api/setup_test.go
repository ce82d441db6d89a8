package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/testenv"
)

var env *controlplanetest.Env

func TestMain(m *testing.M) { os.Exit(controlplanetest.Main(m, &env)) }

const (
	testSessionSecret = "dashboard-test-session-secret-0123456789abcdef"
	testAdmin         = "root@ops.example"
	testMember        = "dev@team.example"
)

// bundle is one test's world: a real controlplane (Postgres, Redis) with
// its bootstrap admin token, and the dashboard API in front of it.
type bundle struct {
	cp      *controlplanetest.Instance
	admin   context.Context // gRPC context with the admin token
	token   string          // the dashboard's admin token
	api     *Server
	ts      *httptest.Server
	cfg     *Config
	clock   *clock.Fake
	logs    *testenv.SyncBuffer
	machine *controlplanetest.ScriptedMachine
}

type setupOpts struct {
	mutate  func(*Config)
	machine bool // start a scripted machine in the default pool
	fake    bool // a fake clock (sessions expire when the test says)
}

// setup starts the controlplane and the dashboard API (dev sign-in on,
// testAdmin an admin, poll interval 100ms) and returns the bundle.
func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	cfg := env.Config(t)
	cfg.Controlplane.LostAgentGrace = "2s"
	cfg.Worker.DefaultImage = "busybox:test"
	controlplanetest.StandInAgent(t, cfg)
	in := controlplanetest.Start(t, cfg, true)
	resp, err := v1.NewAuthServiceClient(in.Conn).Authorize(metadata.AppendToOutgoingContext(context.Background(),
		"x-levers9-bootstrap-secret", cfg.Controlplane.Auth.BootstrapSecret), &v1.AuthorizeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{cp: in, token: resp.Token, logs: &testenv.SyncBuffer{},
		admin: metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+resp.Token)}
	if o.machine {
		controlplanetest.WaitTunnelEndpoint(t, in)
		b.machine = controlplanetest.StartScriptedMachine(t, in, b.admin, "default", 4, 0)
	}
	b.ts = httptest.NewUnstartedServer(nil)
	dc := &Config{Addr: "127.0.0.1:0", PublicURL: "http://" + b.ts.Listener.Addr().String(), Controlplane: in.Server.GRPCAddr(),
		Token: resp.Token, SessionSecret: testSessionSecret, DevSignIn: true, Admins: []string{testAdmin},
		PollInterval: 100 * time.Millisecond}
	if o.mutate != nil {
		o.mutate(dc)
	}
	dc.WithDefaults()
	b.cfg = dc
	var clk clock.Clock = clock.Real()
	if o.fake {
		b.clock = clock.NewFake(time.Now())
		clk = b.clock
	}
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(b.logs, testLogWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	b.api, err = New(dc, Options{Logger: log, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	b.ts.Config.Handler = b.api.Handler()
	b.ts.Start()
	t.Cleanup(func() {
		b.ts.CloseClientConnections()
		b.ts.Close()
		b.api.Stop()
		for _, secret := range []string{testSessionSecret, b.token, dc.GoogleClientSecret} {
			if secret != "" && strings.Contains(b.logs.String(), secret) {
				t.Errorf("a secret appears in the dashboard API's log")
			}
		}
	})
	return b
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Logf("%s", bytes.TrimSpace(p))
	}
	return len(p), nil
}

// browser is a cookie-keeping HTTP client that does not follow redirects
// and remembers the CSRF token of its session.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
	csrf string
}

func (b *bundle) browser(t *testing.T) *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &browser{t: t, base: b.ts.URL, c: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// signedIn returns a browser signed in with the development sign-in.
func (b *bundle) signedIn(t *testing.T, email string) *browser {
	t.Helper()
	br := b.browser(t)
	br.loadCSRF()
	var s sessionResponse
	if code := br.call("POST", "/api/auth/dev", map[string]string{"email": email}, &s); code != http.StatusOK || !s.SignedIn {
		t.Fatalf("dev sign-in as %s: %d %+v", email, code, s)
	}
	br.csrf = s.CSRFToken
	return br
}

// loadCSRF reads the CSRF token from GET /api/session.
func (br *browser) loadCSRF() sessionResponse {
	br.t.Helper()
	var s sessionResponse
	if code := br.call("GET", "/api/session", nil, &s); code != http.StatusOK {
		br.t.Fatalf("GET /api/session: %d", code)
	}
	br.csrf = s.CSRFToken
	return s
}

// call sends a request (with the CSRF header when the browser has a token)
// and decodes a JSON answer into out (when not nil); it returns the status.
func (br *browser) call(method, path string, body any, out any) int {
	br.t.Helper()
	resp := br.do(method, path, body, nil)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, out); err != nil {
			br.t.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return resp.StatusCode
}

func (br *browser) do(method, path string, body any, header http.Header) *http.Response {
	br.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			br.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	u := path
	if strings.HasPrefix(path, "/") {
		u = br.base + path
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		br.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if br.csrf != "" {
		req.Header.Set(CSRFHeader, br.csrf)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := br.c.Do(req)
	if err != nil {
		br.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// submit runs a task through the controlplane's API, as the CLI does.
func (b *bundle) submit(t *testing.T, command ...string) *v1.Task {
	t.Helper()
	resp, err := v1.NewTaskServiceClient(b.cp.Conn).SubmitTask(b.admin, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: command, Retries: 0}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Task
}
