// Package store owns the controlplane's durable state in Postgres: the
// connection pool (pgx), the numbered migrations (goose, run on start under
// a session lock so replicas may start together), and one file of queries
// per table. It maps Postgres failures to errdefs kinds (no row → not found,
// unique violation → already exists, connection trouble → unavailable) and
// never logs or returns sealed or secret values in errors. It knows nothing
// of gRPC. API: internal to the controlplane, changes with it.
package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/levers9/levers9/internal/errdefs"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Store is the controlplane's Postgres store. Safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	log  *slog.Logger
}

// Open makes a pool for connString. It does not wait for Postgres: the pool
// connects on first use and reconnects after an outage by itself.
func Open(ctx context.Context, connString string, log *slog.Logger) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		// The parse error may quote the connection string; do not wrap it.
		return nil, fmt.Errorf("postgres connection settings do not parse: %w", errdefs.ErrInvalidArgument)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create postgres pool: %w", err)
	}
	return &Store{pool: pool, log: log}, nil
}

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// Ping checks that Postgres answers.
func (s *Store) Ping(ctx context.Context) error {
	return wrap("ping postgres", s.pool.Ping(ctx))
}

// Migrate applies every pending migration. It is safe to call from several
// replicas at once.
func (s *Store) Migrate(ctx context.Context) (applied int, err error) {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return 0, err
	}
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return 0, fmt.Errorf("migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithSessionLocker(locker))
	if err != nil {
		return 0, fmt.Errorf("load migrations: %w", err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		return len(res), wrap("apply migrations", err)
	}
	return len(res), nil
}

// dbtx is what the pool and a transaction both offer.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// tx runs fn in a transaction, committing when it returns nil.
func (s *Store) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return wrap("begin", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	if err := fn(tx); err != nil {
		return err
	}
	return wrap("commit", tx.Commit(ctx))
}

// wrap maps a Postgres error to an errdefs kind, prefixed with what was
// being done.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errdefs.IsCanceled(err) {
		return fmt.Errorf("%s: %w", op, err)
	}
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%s: %w", op, errdefs.ErrNotFound)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505":
			return fmt.Errorf("%s: %w", op, errdefs.ErrAlreadyExists)
		case "23502", "23503", "23514", "22P02":
			return fmt.Errorf("%s: %s: %w", op, pgErr.Message, errdefs.ErrInvalidArgument)
		case "57P01", "57P02", "57P03", "53300":
			return fmt.Errorf("%s: postgres is shutting down or full: %w", op, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("%s: postgres error %s: %s", op, pgErr.Code, pgErr.Message)
	}
	// Anything else is the connection: refused, reset, timed out.
	return fmt.Errorf("%s: postgres unreachable: %w", op, errdefs.ErrUnavailable)
}

// QueryStringsForTest runs a query returning one text column.
func (s *Store) QueryStringsForTest(ctx context.Context, q string) ([]string, error) {
	rows, err := s.pool.Query(ctx, q)
	if err != nil {
		return nil, wrap("test query", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, wrap("test query", err)
}
