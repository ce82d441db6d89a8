package seaweed_test

import (
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/levers9/levers9/internal/seaweed"
	"github.com/levers9/levers9/internal/seaweed/seaweedtest"
	"github.com/levers9/levers9/internal/testenv"
)

// TestCluster checks one cluster end to end: the filer API round trip,
// metadata in Postgres, no password in any argv, and the supervisor
// restarting a killed server. One cluster for all, as each takes seconds.
func TestCluster(t *testing.T) {
	env := seaweedtest.Start(t)
	ctx := context.Background()
	f := env.Filer

	t.Run("filer round trip", func(t *testing.T) {
		if err := f.Mkdir(ctx, "/l9t/a/b"); err != nil {
			t.Fatal(err)
		}
		if err := f.Mkdir(ctx, "/l9t/a/b"); err != nil {
			t.Fatalf("mkdir again: %v", err)
		}
		if err := f.Put(ctx, "/l9t/a/b/hello.txt", strings.NewReader("hello, volume")); err != nil {
			t.Fatal(err)
		}
		entries, err := f.List(ctx, "/l9t/a/b")
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != "hello.txt" || entries[0].Size() != 13 || entries[0].IsDir() {
			t.Fatalf("listing = %+v", entries)
		}
		u, err := f.Usage(ctx, "/l9t")
		if err != nil {
			t.Fatal(err)
		}
		if u != (seaweed.Usage{Bytes: 13, Files: 1, Dirs: 2}) {
			t.Fatalf("usage = %+v, want 13 bytes, 1 file, 2 dirs", u)
		}
		rc, err := f.Get(ctx, "/l9t/a/b/hello.txt")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "hello, volume" {
			t.Fatalf("read back %q", b)
		}
	})

	t.Run("metadata lives in postgres", func(t *testing.T) {
		conn, err := pgx.Connect(ctx, env.PG.URL(env.DBName))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM filemeta WHERE directory = '/l9t/a/b' AND name = 'hello.txt'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("filemeta rows for hello.txt = %d, want 1", n)
		}
	})

	t.Run("delete", func(t *testing.T) {
		if err := f.Delete(ctx, "/l9t"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.List(ctx, "/l9t/a"); !errors.Is(err, seaweed.ErrNotFound) {
			t.Fatalf("listing a deleted dir: %v, want not found", err)
		}
		if err := f.Delete(ctx, "/l9t"); err != nil {
			t.Fatalf("deleting again: %v", err)
		}
	})

	t.Run("no password in argv", func(t *testing.T) {
		for _, p := range env.Cluster.Processes() {
			pid := p.PID()
			cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(cmdline), env.PG.Password) {
				t.Errorf("%s's argv holds the Postgres password", p.Name)
			}
		}
		conf, err := os.ReadFile(env.Dir + "/filer/filer.toml")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(conf), env.PG.Password) {
			t.Error("filer.toml holds the Postgres password")
		}
	})

	checkSecured(t, env)

	t.Run("killed server restarted", func(t *testing.T) {
		vol := env.Cluster.Processes()[1]
		old := vol.PID()
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "the volume server restarted", func() bool {
			return vol.Restarts() >= 1 && vol.PID() != old
		})
		// And the cluster takes writes again.
		testenv.Eventually(t, 60*time.Second, "a write after the restart", func() bool {
			return f.Put(ctx, "/l9t2/after.txt", strings.NewReader("x")) == nil
		})
	})
}

func TestProcessStartStop(t *testing.T) {
	dir := t.TempDir()
	for i := range 20 {
		p := &seaweed.Process{Name: "sleep", Bin: "/bin/sleep", Args: []string{"60"}, LogPath: dir + "/sleep.log", Restart: true}
		if err := p.Stop(); err != nil {
			t.Fatalf("stop before start: %v", err)
		}
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(context.Background()); err == nil {
			t.Fatal("second start accepted")
		}
		pid := p.PID()
		if err := p.Stop(); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if err := p.Stop(); err != nil {
			t.Fatalf("stop twice: %v", err)
		}
		if err := syscall.Kill(pid, 0); err == nil {
			t.Fatalf("round %d: pid %d still alive after Stop", i, pid)
		}
	}
}

func TestProcessRestartsWithBackoff(t *testing.T) {
	dir := t.TempDir()
	p := &seaweed.Process{Name: "false", Bin: "/bin/sh", Args: []string{"-c", "echo ran >> " + dir + "/count; exit 3"}, LogPath: dir + "/log", Restart: true}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	testenv.Eventually(t, 10*time.Second, "three runs", func() bool {
		b, _ := os.ReadFile(dir + "/count")
		return strings.Count(string(b), "ran") >= 3
	})
	if p.Restarts() < 2 {
		t.Fatalf("restarts = %d, want at least 2", p.Restarts())
	}
}
