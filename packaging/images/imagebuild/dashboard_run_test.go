package imagebuild

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox"
)

// TestDashboardAPIImageServesHealth runs the dashboard API image (amd64)
// read-only as its own user in a hardened runc container, against a gRPC
// health server the test serves as the controlplane: /healthz must say the
// controlplane is reachable, and the secrets, given as env, must not show
// in its output.
func TestDashboardAPIImageServesHealth(t *testing.T) {
	ctx, img := amd64Image(t, "dashboard-api")

	n := testNetns(t)
	l, err := net.Listen("tcp", net.JoinHostPort(n.hostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)

	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(n.containerIP, strconv.Itoa(port))
	const token, session = "l9img-SECRET-TOKEN", "l9img-SECRET-SESSION-0123456789abcdef0123456789"
	h, out := runImage(t, ctx, img, n, "l9img-dashapi", []string{
		"LEVERS9_DASHBOARD_ADDR=" + addr,
		"LEVERS9_DASHBOARD_PUBLIC_URL=http://" + addr,
		"LEVERS9_DASHBOARD_CONTROLPLANE=" + l.Addr().String(),
		"LEVERS9_DASHBOARD_DEV_SIGNIN=true",
	}, sandbox.SecretEnv{"LEVERS9_DASHBOARD_TOKEN=" + token, "LEVERS9_DASHBOARD_SESSION_SECRET=" + session})
	_, body := waitGet(t, ctx, h, "http://"+addr+"/healthz", out)
	if !strings.Contains(body, `"controlplane":"ok"`) {
		t.Errorf("/healthz said %s", body)
	}
	// The controlplane going away shows in /healthz (readiness in the chart).
	gs.Stop()
	testenv.Eventually(t, 30*time.Second, "/healthz to report the controlplane unreachable", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	if s := out.String(); strings.Contains(s, token) || strings.Contains(s, session) {
		t.Errorf("a secret appeared in the dashboard API's output:\n%s", s)
	}
}

// TestDashboardWebImageServes runs the web image (Node.js from trixie,
// the standalone server) read-only as its own user in a hardened runc
// container: /signin must be served with the security headers naming the
// API base the image was built for.
func TestDashboardWebImageServes(t *testing.T) {
	b := setup(t)
	testenv.RequireBinary(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w, err := webBuild()
	if err != nil {
		testenv.Missing(t, "standalone build of dashboard/web (needs node 20.9+ and npm): %v", err)
	}
	b.opts.Web = w
	built, err := Build(ctx, "dashboard-web", b.opts)
	if err != nil {
		t.Fatal(err)
	}
	n := testNetns(t)
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	h, out := runImage(t, ctx, built.Image, n, "l9img-dashweb", []string{"HOSTNAME=" + n.containerIP, "PORT=" + strconv.Itoa(port)}, nil)
	url := "http://" + net.JoinHostPort(n.containerIP, strconv.Itoa(port)) + "/signin"
	hdr, body := waitGet(t, ctx, h, url, out)
	if !strings.Contains(body, "<html") {
		t.Errorf("/signin is not a page: %.300s", body)
	}
	if got := hdr.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options %q", got)
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, testAPIBase) {
		t.Errorf("Content-Security-Policy %q does not name the API base %s", csp, testAPIBase)
	}
}
