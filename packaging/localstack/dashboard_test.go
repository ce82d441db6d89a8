package localstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/dashboard/web"
	"github.com/levers9/levers9/internal/testenv"
)

// TestEnsureDashboard runs make up's dashboard step against a real
// controlplane over TLS: the API starts from bin/ with development sign-in
// on, answers on its port, keeps its secrets out of argv and environment,
// is kept when nothing changed, and the printed line names the URL.
func TestEnsureDashboard(t *testing.T) {
	// Postgres and Redis for this test only, so the package's other tests
	// need no services.
	env, err := controlplanetest.StartEnv(context.Background())
	if err != nil {
		testenv.Missing(t, "Postgres and Redis: %v", err)
		return
	}
	t.Cleanup(env.Stop)
	root := t.TempDir()
	p := NewPaths(root)
	build := exec.Command("go", "build", "-o", p.Bin+"/", "./cmd/levers9-dashboard-api")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cert, key := controlplanetest.SelfSignedTLS(t)
	cfg := env.Config(t)
	cfg.Controlplane.TLS.CertFile, cfg.Controlplane.TLS.KeyFile = cert, key
	in := controlplanetest.Start(t, cfg, true)
	resp, err := v1.NewAuthServiceClient(in.Conn).Authorize(metadata.AppendToOutgoingContext(context.Background(),
		"x-levers9-bootstrap-secret", cfg.Controlplane.Auth.BootstrapSecret), &v1.AuthorizeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(cert)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(p.file("tls"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.file("tls/cert.pem"), pem, 0o644); err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(in.Server.GRPCAddr(), ":")
	st := &State{AdminToken: resp.Token}
	st.GRPCPort, _ = strconv.Atoi(port)
	t.Cleanup(func() { stopProcess(p.file("dashboard-api.pid"), "the dashboard API", func(string, ...any) {}) })
	t.Cleanup(func() { stopProcess(p.file("dashboard-web.pid"), "the dashboard web app", func(string, ...any) {}) })
	if err := pickDashboardWebPort(p, st); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	sayf := func(f string, a ...any) { out.WriteString(fmt.Sprintf(f, a...) + "\n") }
	if err := ensureDashboard(context.Background(), p, st, sayf); err != nil {
		t.Fatal(err)
	}
	url := st.DashboardURL()
	if url == "" || !strings.Contains(out.String(), "dashboard API healthy: "+url) {
		t.Fatalf("output does not name the URL:\n%s", out.String())
	}
	var s struct {
		DevSignIn bool `json:"devSignIn"`
	}
	r, err := http.Get(url + "/api/session")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(r.Body).Decode(&s)
	r.Body.Close()
	if !s.DevSignIn {
		t.Error("development sign-in is not on in the local stack")
	}
	// Secrets: in 0600 files, never in argv or the environment.
	pid, err := readPid(p.file("dashboard-api.pid"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"cmdline", "environ"} {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(resp.Token)) || bytes.Contains(b, []byte(st.DashboardSessionSecret)) {
			t.Errorf("a secret is in the dashboard API's %s", f)
		}
	}
	for _, f := range []string{"dashboard/token", "dashboard/session-secret", "stack.json"} {
		fi, err := os.Stat(p.file(f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v mode %v, want 0600", f, err, fi.Mode().Perm())
		}
	}
	// Nothing changed: the running API is kept.
	out.Reset()
	if err := ensureDashboard(context.Background(), p, st, sayf); err != nil {
		t.Fatal(err)
	}
	if pid2, _ := readPid(p.file("dashboard-api.pid")); pid2 != pid || !strings.Contains(out.String(), "already running") {
		t.Errorf("second run: pid %d -> %d, output:\n%s", pid, pid2, out.String())
	}

	// The web app: built for this API, served on its own port, and the
	// one origin the API lets in.
	if _, err := web.CheckNode(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	webDir, err := filepath.Abs(filepath.Join("..", "..", "dashboard", "web"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ensureDashboardWeb(context.Background(), p, webDir, st, sayf); err != nil {
		t.Fatal(err)
	}
	webURL := st.DashboardWebURL()
	wr, err := http.Get(webURL + "/signin")
	if err != nil {
		t.Fatal(err)
	}
	wr.Body.Close()
	if wr.StatusCode != 200 || !strings.Contains(wr.Header.Get("Content-Security-Policy"), "form-action 'self' "+url) {
		t.Errorf("web app: %d, policy %q (want the API %s in it)", wr.StatusCode, wr.Header.Get("Content-Security-Policy"), url)
	}
	req, _ := http.NewRequest("GET", url+"/api/session", nil)
	req.Header.Set("Origin", webURL)
	cr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	cr.Body.Close()
	if got := cr.Header.Get("Access-Control-Allow-Origin"); got != webURL {
		t.Errorf("the API allows origin %q, want the web app's %s", got, webURL)
	}
	webPid, _ := readPid(p.file("dashboard-web.pid"))
	out.Reset()
	if err := ensureDashboardWeb(context.Background(), p, webDir, st, sayf); err != nil {
		t.Fatal(err)
	}
	if pid2, _ := readPid(p.file("dashboard-web.pid")); pid2 != webPid || !strings.Contains(out.String(), "already running") {
		t.Errorf("second web run: pid %d -> %d, output:\n%s", webPid, pid2, out.String())
	}
	var next bytes.Buffer
	printNext(&next, webURL, url, true)
	if !strings.Contains(next.String(), "dashboard: "+webURL) || !strings.Contains(next.String(), "dashboard API: "+url) ||
		!strings.Contains(next.String(), "levers9 run --volume data:/data") {
		t.Errorf("the closing lines do not name the dashboard:\n%s", next.String())
	}
	logb, _ := os.ReadFile(p.file("dashboard-api.log"))
	if !strings.Contains(string(logb), "development sign-in is ON") || strings.Contains(string(logb), resp.Token) {
		t.Errorf("dashboard log: want the dev sign-in warning and no token:\n%s", logb)
	}
}
