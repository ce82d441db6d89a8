package imagebuild

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox"
)

// unpack writes an image's flattened filesystem under dir (what the
// agent's image cache does with a pulled image).
func unpack(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		mode := os.FileMode(h.Mode & 0o777)
		if h.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		// mutate.Extract goes from the top layer down, so a file can come
		// before its directory's entry.
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600); err == nil {
				_, err = io.Copy(f, tr)
				f.Close()
			}
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeLink:
			// Debian root filesystems hard-link a few files (perl).
			_ = os.Remove(p)
			err = os.Link(filepath.Join(dir, filepath.Clean("/"+h.Linkname)), p)
		default:
			t.Fatalf("unexpected %s (type %q) in the image", h.Name, h.Typeflag)
		}
		if err == nil {
			err = os.Lchown(p, h.Uid, h.Gid)
		}
		if err == nil && h.Typeflag != tar.TypeSymlink && h.Typeflag != tar.TypeLink {
			err = os.Chmod(p, mode)
		}
		if err != nil {
			t.Fatalf("unpack %s: %v", h.Name, err)
		}
	}
}

// runImage unpacks img and runs its entrypoint as its own user on a
// read-only root in a hardened runc container in the network namespace n,
// with extra env and secret env; it returns the container's handle and
// output.
func runImage(t *testing.T, ctx context.Context, img v1.Image, n netnsInfo, id string, env []string, secrets sandbox.SecretEnv) (*sandbox.Handle, *testenv.SyncBuffer) {
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
	return h, out
}

// waitGet polls url until it answers 200 and returns that response's
// header and body; it fails at once when the container h has stopped.
func waitGet(t *testing.T, ctx context.Context, h *sandbox.Handle, url string, out *testenv.SyncBuffer) (http.Header, string) {
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
		if st, err := h.State(ctx); err == nil && st.Status == sandbox.StatusStopped {
			t.Fatalf("the container exited before %s answered 200 (last: %s); its output:\n%s", url, last, out.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 200 from %s within 60s (last: %s); container output:\n%s", url, last, out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestControlplaneImageServesHealth runs the controlplane image's amd64
// root filesystem, read-only, as its own user, in a hardened runc
// container made by the sandbox package, against the test Postgres and
// Redis: it must answer /healthz. The hardened spec sets per-namespace
// sysctls, which runc refuses in the host's network namespace, so the
// container joins a namespace of the test's own (by path, as the agent
// joins the egress package's) with a veth to the host, where the test
// forwards to Postgres and Redis on 127.0.0.1.
func TestControlplaneImageServesHealth(t *testing.T) {
	ctx, img := amd64Image(t, "controlplane")

	env, err := controlplanetest.StartEnv(ctx)
	if err != nil {
		testenv.Missing(t, "postgres and redis: %v", err)
	}
	t.Cleanup(env.Stop)
	cfg := env.Config(t)
	restPort, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	grpcPort, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	pg, rd := cfg.Database.Postgres, cfg.Database.Redis
	n := testNetns(t)
	pgAddr := forward(t, n.hostIP, pg.Host+":"+strconv.Itoa(pg.Port))
	redisAddr := forward(t, n.hostIP, rd.Addr)
	rest := net.JoinHostPort(n.containerIP, strconv.Itoa(restPort))
	h, out := runImage(t, ctx, img, n, "l9img-healthz", []string{
		"LEVERS9_CONTROLPLANE_GRPCADDR=127.0.0.1:" + strconv.Itoa(grpcPort),
		"LEVERS9_CONTROLPLANE_RESTADDR=" + rest,
		"LEVERS9_CONTROLPLANE_TUNNELADDR=" + cfg.Controlplane.TunnelAddr,
		"LEVERS9_CONTROLPLANE_METRICS_ADDR=off",
		"LEVERS9_DATABASE_POSTGRES_HOST=" + n.hostIP,
		"LEVERS9_DATABASE_POSTGRES_PORT=" + strconv.Itoa(pgAddr.Port),
		"LEVERS9_DATABASE_POSTGRES_USER=" + pg.User,
		"LEVERS9_DATABASE_POSTGRES_DATABASE=" + pg.Database,
		"LEVERS9_DATABASE_POSTGRES_SSLMODE=" + pg.SSLMode,
		"LEVERS9_DATABASE_REDIS_ADDR=" + redisAddr.String(),
		"LEVERS9_DATABASE_REDIS_DB=" + strconv.Itoa(rd.DB),
	}, sandbox.SecretEnv{
		"LEVERS9_POSTGRES_PASSWORD=" + pg.Password,
		"LEVERS9_REDIS_PASSWORD=" + rd.Password,
		"LEVERS9_ENCRYPTION_KEY=" + pg.EncryptionKey,
	})
	waitGet(t, ctx, h, "http://"+rest+"/healthz", out)
	if strings.Contains(out.String(), pg.Password) {
		t.Error("the Postgres password appeared in the controlplane's output")
	}
}

// netnsPrefix names the test's network namespaces and veths.
const netnsPrefix = "l9img"

// netnsInfo is a network namespace with a veth to the host.
type netnsInfo struct {
	path                string // /run/netns/NAME
	hostIP, containerIP string
}

// testNetns makes a network namespace with loopback up and a /30 veth to
// the host, removed in t.Cleanup; namespaces a killed run left behind (their
// test process gone) are removed first.
func testNetns(t *testing.T) netnsInfo {
	t.Helper()
	testenv.RequireBinary(t, "ip")
	left, _ := filepath.Glob("/run/netns/" + netnsPrefix + "-*")
	for _, p := range left {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(p), netnsPrefix+"-"))
		if err == nil && syscall.Kill(pid, 0) != nil {
			_ = exec.Command("ip", "netns", "del", filepath.Base(p)).Run()
		}
	}
	pid := os.Getpid()
	ns := fmt.Sprintf("%s-%d", netnsPrefix, pid)
	hostIf, nsIf := fmt.Sprintf("%s%dh", netnsPrefix, pid%1000000), fmt.Sprintf("%s%dc", netnsPrefix, pid%1000000)
	// 10.213.0.0/16 split into /30s by pid: a range no other levers9 test uses.
	base := 4 * (pid % 16384)
	hostIP := fmt.Sprintf("10.213.%d.%d", base/256, base%256+1)
	nsIP := fmt.Sprintf("10.213.%d.%d", base/256, base%256+2)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	run("link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	run("link", "set", nsIf, "netns", ns)
	run("addr", "add", hostIP+"/30", "dev", hostIf)
	run("link", "set", hostIf, "up")
	run("-n", ns, "addr", "add", nsIP+"/30", "dev", nsIf)
	run("-n", ns, "link", "set", nsIf, "up")
	run("-n", ns, "link", "set", "lo", "up")
	return netnsInfo{path: "/run/netns/" + ns, hostIP: hostIP, containerIP: nsIP}
}

// forward listens on ip (a free port) and relays each connection to
// target, until t ends.
func forward(t *testing.T, ip, target string) *net.TCPAddr {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{})
				go func() { _, _ = io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); close(done) }()
				_, _ = io.Copy(c, up)
				c.(*net.TCPConn).CloseWrite()
				<-done
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr)
}

// amd64Image builds the image name for amd64 only, for a test that runs
// it with runc, and returns it with a context that ends 3 minutes on.
func amd64Image(t *testing.T, name string) (context.Context, v1.Image) {
	t.Helper()
	b := setup(t)
	testenv.RequireBinary(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	b.opts.ControlplanePlatforms = []string{"amd64"}
	built, err := Build(ctx, name, b.opts)
	if err != nil {
		t.Fatal(err)
	}
	m, err := built.Index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := built.Index.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, img
}
