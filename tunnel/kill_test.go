package tunnel_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/tunnel"
	"github.com/levers9/levers9/tunnel/tunneltest"
)

// runChildServer is the controlplane process of TestServerSIGKILLed: the
// test binary re-executed with L9T_CHILD_SERVER=<dir>.
func runChildServer(dir string) error {
	ca, err := tunneltest.LoadCA(dir)
	if err != nil {
		return err
	}
	stls, err := ca.ServerTLS()
	if err != nil {
		return err
	}
	key, err := os.ReadFile(filepath.Join(dir, "reset.key"))
	if err != nil {
		return err
	}
	var k [32]byte
	copy(k[:], key)
	gs := grpc.NewServer()
	tunneltest.RegisterEcho(gs, func(ctx context.Context, in []byte) ([]byte, error) {
		a, ok := tunnel.CallerFromContext(ctx)
		if !ok {
			return nil, errors.New("no caller")
		}
		return []byte("cp:" + a.Identity + ":" + string(in)), nil
	})
	hub, err := tunnel.NewHub(tunnel.HubConfig{Server: gs})
	if err != nil {
		return err
	}
	srv, err := tunnel.NewServer(tunnel.ServerConfig{
		Addr: os.Getenv("L9T_CHILD_ADDR"), TLS: stls, QUICStatelessResetKey: &k,
		Authorize: func(_ context.Context, c *x509.Certificate) (string, error) { return c.Subject.CommonName, nil },
		OnSession: hub.HandleSession,
	})
	if err != nil {
		return err
	}
	if err := srv.Start(context.Background()); err != nil {
		return err
	}
	fmt.Println(srv.Addr().String())
	select {} // until killed
}

func startChildServer(t *testing.T, dir, addr string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "L9T_CHILD_SERVER="+dir, "L9T_CHILD_ADDR="+addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child server: %v", err)
	}
	return cmd, strings.TrimSpace(line)
}

// A controlplane process SIGKILLed (no CONNECTION_CLOSE, no FIN for QUIC)
// and restarted: agents notice (QUIC through the stateless reset the new
// process sends with the shared key) and their calls work again, with the
// default liveness settings.
func TestServerSIGKILLedAndRestarted(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			ca, err := tunneltest.NewCA("l9t-kill")
			if err != nil {
				t.Fatal(err)
			}
			if err := ca.WritePEM(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "reset.key"), []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd, addr := startChildServer(t, dir, "127.0.0.1:0")
			e := &cpEnv{ca: ca, addr: addr}
			a := setupAgent(t, e, "m-kill", func(c *tunnel.ClientConfig) {
				tr.mod(c)
				c.Liveness = tunnel.Liveness{} // defaults
				c.BackoffBase, c.BackoffMax = time.Second, 5*time.Second
			})
			call := func(msg string) error {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				got, err := tunneltest.Echo(ctx, a.cc, []byte(msg))
				if err == nil && string(got) != "cp:m-kill:"+msg {
					return fmt.Errorf("answer %q", got)
				}
				return err
			}
			testenv.Eventually(t, 10*time.Second, "first call", func() bool { return call("before") == nil })
			first := a.last()
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
			start := time.Now()
			startChildServer(t, dir, addr)
			// The reset (QUIC) or the RST (TCP) usually ends the old session
			// within a second or two. The bound is what the product promises
			// when neither arrives: QUIC resends into a silent peer on a
			// doubling timer, so under load the packet that would draw the
			// reset can come late, and then the 12 s heartbeat timeout plus
			// one backoff step decide.
			testenv.Eventually(t, 20*time.Second, "calls work after the restart", func() bool { return a.last() != first && call("after") == nil })
			t.Logf("%s: back %s after the restart", tr.name, time.Since(start))
		})
	}
}
