package devstack

import (
	"context"
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
