// Package seaweedtest starts a real single-node SeaweedFS for a test:
// master, volume server and filer on free 127.0.0.1 ports, the filer's
// metadata in a private Postgres (internal/devstack), all stopped at the
// test's cleanup. Without the weed binary (or Postgres) the test is
// skipped, or fails under CI=true (testenv's rule). Test support only.
package seaweedtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/seaweed"
	"github.com/levers9/levers9/internal/testenv"
)

// Env is a running cluster and what a test needs to use it.
type Env struct {
	Bin     string
	Cluster *seaweed.Cluster
	// Filer is signed with the cluster's filer keys.
	Filer *seaweed.Filer
	// Security is the cluster's credentials (Cluster.SecurityDir).
	Security *seaweed.Security
	PG       *devstack.Postgres
	DBName   string
	Dir      string
}

// Bin returns the weed binary, skipping t (failing under CI) when it
// cannot be found or built.
func Bin(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatalf("finding the working directory: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	bin, err := FindBin(ctx, wd)
	if err != nil {
		testenv.Missing(t, "the weed binary ($%s or bash %s): %v", BinEnv, BuildScriptPath, err)
	}
	return bin
}

// Start starts Postgres and a cluster whose filer uses it.
func Start(t testing.TB) *Env {
	t.Helper()
	bin := Bin(t)
	dir, err := os.MkdirTemp("", "l9sw-")
	if err != nil {
		t.Fatal(err)
	}
	// The postgres user (devstack runs Postgres as it under root) must
	// reach its data dir below this one.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, err := devstack.StartPostgres(ctx, filepath.Join(dir, "pg"), devstack.PostgresOptions{})
	if err != nil {
		testenv.Missing(t, "Postgres for the filer: %v", err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	return StartWith(t, bin, pg, dir, "")
}

// StartWith starts a cluster whose filer keeps its metadata in a new
// database of pg, with its files under dir, its servers on host
// (127.0.0.1 when empty; an end-to-end test uses an address its agents'
// network namespaces reach).
func StartWith(t testing.TB, bin string, pg *devstack.Postgres, dir, host string) *Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := fmt.Sprintf("l9sw_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	if err := pg.CreateDatabase(ctx, db); err != nil {
		t.Fatalf("creating the filer's database: %v", err)
	}
	swDir := filepath.Join(dir, "seaweedfs")
	c, err := seaweed.StartCluster(ctx, seaweed.ClusterOptions{
		Bin: bin, Dir: swDir, Host: host,
		Postgres: seaweed.PostgresStore{Host: pg.Host, Port: pg.Port, User: pg.User, Password: pg.Password, Database: db},
	})
	if err != nil {
		t.Fatalf("starting SeaweedFS: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range c.Processes() {
				b, _ := os.ReadFile(p.LogPath)
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("%s log (tail):\n%s", p.Name, b)
			}
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping SeaweedFS: %v", err)
		}
	})
	sec, err := c.Security()
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Bin: bin, Cluster: c, Filer: &seaweed.Filer{URL: c.FilerURL(), Keys: sec.FilerKeys()}, Security: sec, PG: pg, DBName: db, Dir: swDir}
}
