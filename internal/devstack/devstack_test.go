package devstack

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/levers9/levers9/internal/testenv"
)

func TestPostgresAndRedisStartStop(t *testing.T) {
	if _, err := findBin("initdb"); err != nil {
		testenv.Missing(t, "postgres: %v", err)
	}
	testenv.RequireBinary(t, "redis-server")
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "l9dev-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pg, err := StartPostgres(ctx, dir+"/pg", PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	if err := pg.CreateDatabase(ctx, "l9dev_db"); err != nil {
		t.Fatal(err)
	}
	rd, err := StartRedis(ctx, dir+"/redis", 0, "pw")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := net.Dial("tcp", rd.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := rd.Stop(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", rd.Addr()); err == nil {
		c.Close()
		t.Error("redis still answers after Stop")
	}
	if err := pg.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", pg.Addr()); err == nil {
		c.Close()
		t.Error("postgres still answers after StopServer")
	}
	if err := pg.StartServer(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
}

// TestFreePortsBelowEphemeral: picked ports are distinct, free for TCP and
// UDP, and below the kernel's ephemeral range, where no outgoing
// connection can take one before the caller binds it.
func TestFreePortsBelowEphemeral(t *testing.T) {
	top := ephemeralStart()
	if top <= lowestPort {
		t.Skipf("ephemeral range starts at %d: no room below it", top)
	}
	ports, err := FreeTCPUDPPorts("127.0.0.1", 20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p < lowestPort || p >= top || seen[p] {
			t.Errorf("port %d: outside [%d, %d) or given twice (%v)", p, lowestPort, top, ports)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Errorf("port %d not free for TCP: %v", p, err)
			continue
		}
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Errorf("port %d not free for UDP: %v", p, err)
		} else {
			u.Close()
		}
		l.Close()
	}
	p, err := FreePort()
	if err != nil || p < lowestPort || p >= top {
		t.Errorf("FreePort: %d %v", p, err)
	}
	if _, err := FreeTCPUDPPorts("192.0.2.1", 1); err == nil {
		t.Error("ports on an address this host does not have")
	}
}
