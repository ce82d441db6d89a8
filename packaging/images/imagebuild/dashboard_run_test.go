package imagebuild

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox"
)

// runImage unpacks img and runs its entrypoint as its own user on a
// read-only root in a hardened runc container in the network namespace n,
// with extra env and secret env; it returns the container's output.
func runImage(t *testing.T, ctx context.Context, img v1.Image, n netnsInfo, id string, env []string, secrets sandbox.SecretEnv) *testenv.SyncBuffer {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	unpack(t, img, rootfs)
	task := sandbox.TaskSpec{
		ID: id, Rootfs: rootfs, RootfsReadonly: true,
		Args: cf.Config.Entrypoint, User: cf.Config.User, ImageUser: cf.Config.User, Cwd: cf.Config.WorkingDir,
		Env: append(cf.Config.Env, env...), SecretEnv: secrets, NetNSPath: n.path,
	}
	host, err := sandbox.DetectHost(ctx, sandbox.NVIDIADiscovery{})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := sandbox.New(sandbox.Config{Prefix: "l9img", StateDir: "/run/l9img-test", CgroupParent: "/l9img-test", Host: host})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Reconcile(ctx); err != nil {
		t.Fatalf("reconcile leftovers: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Reconcile(context.Background()); err != nil {
			t.Errorf("reconcile: %v", err)
		}
	})
	out := &testenv.SyncBuffer{}
	h, err := sb.Run(ctx, task, sandbox.Security{Profile: sandbox.ProfileHardened, Seccomp: sandbox.SeccompEnforce,
		DropNetRaw: true, Runtime: sandbox.RuntimeRunc}, sandbox.Stdio{Stdout: out, Stderr: out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.Kill(context.Background(), syscall.SIGKILL)
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = h.Wait(wctx)
		_ = h.Delete(context.Background())
	})
	return out
}

// waitGet polls url until it answers 200 and returns that response's
// header and body.
func waitGet(t *testing.T, url string, out *testenv.SyncBuffer) (http.Header, string) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	for deadline := time.Now().Add(60 * time.Second); ; {
		resp, err := client.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return resp.Header, string(body)
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 200 from %s within 60s (last: %s); container output:\n%s", url, last, out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestDashboardAPIImageServesHealth runs the dashboard API image (amd64)
// read-only as its own user in a hardened runc container, against a gRPC
// health server the test serves as the controlplane: /healthz must say the
// controlplane is reachable, and the secrets, given as env, must not show
// in its output.
func TestDashboardAPIImageServesHealth(t *testing.T) {
	b := setup(t)
	testenv.RequireBinary(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b.opts.ControlplanePlatforms = []string{"amd64"}
	img := firstImage(ctx, t, b.opts, "dashboard-api")

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
	out := runImage(t, ctx, img, n, "l9img-dashapi", []string{
		"LEVERS9_DASHBOARD_ADDR=" + addr,
		"LEVERS9_DASHBOARD_PUBLIC_URL=http://" + addr,
		"LEVERS9_DASHBOARD_CONTROLPLANE=" + l.Addr().String(),
		"LEVERS9_DASHBOARD_DEV_SIGNIN=true",
	}, sandbox.SecretEnv{"LEVERS9_DASHBOARD_TOKEN=" + token, "LEVERS9_DASHBOARD_SESSION_SECRET=" + session})
	_, body := waitGet(t, "http://"+addr+"/healthz", out)
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
	out := runImage(t, ctx, built.Image, n, "l9img-dashweb", []string{"HOSTNAME=" + n.containerIP, "PORT=" + strconv.Itoa(port)}, nil)
	url := "http://" + net.JoinHostPort(n.containerIP, strconv.Itoa(port)) + "/signin"
	hdr, body := waitGet(t, url, out)
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
