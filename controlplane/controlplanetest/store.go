package controlplanetest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/devstack"
)

// template is a database migrated once per test binary; NewStore clones it.
type template struct {
	once sync.Once
	name string
	err  error
}

// NewStore opens a store on a new database of its own, already migrated,
// and closes it when the test ends. The database is a copy of one migrated
// once per test binary, so a test that commits (or runs concurrent
// transactions) costs a CREATE DATABASE, not a migration. It returns the
// connection string too, for a second store on the same database.
func (e *Env) NewStore(t testing.TB) (*store.Store, string) {
	t.Helper()
	ctx := context.Background()
	tmpl, err := e.migratedTemplate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("l9t_%d_%d", os.Getpid(), e.dbs.Add(1))
	if err := e.adminExec(ctx, fmt.Sprintf(`CREATE DATABASE %q TEMPLATE %q`, name, tmpl)); err != nil {
		t.Fatalf("clone the migrated database: %v", err)
	}
	url := e.PG.URL(name)
	st, err := store.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st, url
}

// NewBus returns a client on a Redis database of its own (shared with no
// other test running at the same time), emptied first, closed when the
// test ends.
func (e *Env) NewBus(t testing.TB) *bus.Bus {
	t.Helper()
	b := bus.New(bus.Options{Addr: e.Redis.Addr(), Password: e.Redis.Password, DB: int(e.redisDBs.Add(1) % devstack.RedisDatabases)})
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Redis().FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *Env) migratedTemplate(ctx context.Context) (string, error) {
	e.tmpl.once.Do(func() {
		name := fmt.Sprintf("l9tmpl_%d", os.Getpid())
		if e.tmpl.err = e.PG.CreateDatabase(ctx, name); e.tmpl.err != nil {
			return
		}
		st, err := store.Open(ctx, e.PG.URL(name), nil)
		if err != nil {
			e.tmpl.err = err
			return
		}
		// Close before cloning: Postgres copies no database with sessions.
		defer st.Close()
		if _, err := st.Migrate(ctx); err != nil {
			e.tmpl.err = fmt.Errorf("migrate the template database: %w", err)
			return
		}
		e.tmpl.name = name
	})
	return e.tmpl.name, e.tmpl.err
}

// adminExec runs one statement on the cluster's postgres database.
func (e *Env) adminExec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, e.PG.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}
