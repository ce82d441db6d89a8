package devstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Postgres is a private Postgres cluster.
type Postgres struct {
	Dir      string
	Host     string
	Port     int
	User     string
	Password string

	as     serviceUser
	pgCtl  string
	logDir string
}

// PostgresOptions configures StartPostgres. Zero values pick defaults: a
// free port, user "levers9", a random password.
type PostgresOptions struct {
	Port     int
	User     string
	Password string
}

// StartPostgres initialises a cluster in dir (reusing one already there)
// and starts it. The server daemonises: call Stop to end it.
func StartPostgres(ctx context.Context, dir string, opts PostgresOptions) (*Postgres, error) {
	as, err := postgresUser()
	if err != nil {
		return nil, err
	}
	initdb, err := findBin("initdb")
	if err != nil {
		return nil, err
	}
	pgCtl, err := findBin("pg_ctl")
	if err != nil {
		return nil, err
	}
	if opts.User == "" {
		opts.User = "levers9"
	}
	if opts.Password == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		opts.Password = hex.EncodeToString(b)
	}
	if opts.Port == 0 {
		if opts.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	p := &Postgres{Dir: dir, Host: "127.0.0.1", Port: opts.Port, User: opts.User, Password: opts.Password,
		as: as, pgCtl: pgCtl, logDir: filepath.Join(dir, "log")}
	data := filepath.Join(dir, "data")
	if err := as.mkdir(dir); err != nil {
		return nil, fmt.Errorf("postgres dir: %w", err)
	}
	if err := as.canReach(dir); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); os.IsNotExist(err) {
		pwfile := filepath.Join(dir, "pwfile")
		if err := os.WriteFile(pwfile, []byte(opts.Password+"\n"), 0o600); err != nil {
			return nil, err
		}
		_ = os.Chown(pwfile, as.uid, as.gid)
		err := run(as.command(ctx, initdb, "-D", data, "-U", opts.User, "--pwfile", pwfile,
			"--auth", "scram-sha-256", "-E", "UTF8", "--no-sync"), "initdb")
		os.Remove(pwfile)
		if err != nil {
			return nil, err
		}
	}
	if err := p.StartServer(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// StartServer starts (or restarts after StopServer) the server process.
func (p *Postgres) StartServer(ctx context.Context) error {
	data := filepath.Join(p.Dir, "data")
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories=%s -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
		p.Port, p.Dir)
	if err := run(p.as.command(ctx, p.pgCtl, "-D", data, "-l", filepath.Join(p.Dir, "postgres.log"), "-o", opts, "-w", "-t", "60", "start"), "pg_ctl start"); err != nil {
		return err
	}
	return waitTCP(ctx, p.Addr(), 30*time.Second)
}

// StopServer stops the server but keeps its data (for outage tests).
func (p *Postgres) StopServer(ctx context.Context) error {
	return run(p.as.command(ctx, p.pgCtl, "-D", filepath.Join(p.Dir, "data"), "-m", "fast", "-w", "stop"), "pg_ctl stop")
}

// Stop stops the server. The data directory stays; the caller removes it.
func (p *Postgres) Stop() error {
	return p.StopServer(context.Background())
}

// Addr is HOST:PORT.
func (p *Postgres) Addr() string { return net.JoinHostPort(p.Host, strconv.Itoa(p.Port)) }

// URL is a connection string for database db. It holds the password.
func (p *Postgres) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(p.User, p.Password), Host: p.Addr(), Path: "/" + db,
		RawQuery: "sslmode=disable"}
	return u.String()
}

// CreateDatabase creates database name, owned by the cluster's user.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) error {
	psql, err := findBin("psql")
	if err != nil {
		return err
	}
	cmd := p.as.command(ctx, psql, "-h", p.Host, "-p", strconv.Itoa(p.Port), "-U", p.User, "-d", "postgres",
		"-v", "ON_ERROR_STOP=1", "-c", fmt.Sprintf(`CREATE DATABASE "%s"`, name))
	cmd.Env = append(cmd.Env, "PGPASSWORD="+p.Password)
	return run(cmd, "create database "+name)
}

// AttachForStop prepares a Postgres value built from a Dir alone (a
// cluster started by an earlier process) so StopServer works.
func (p *Postgres) AttachForStop() error {
	as, err := postgresUser()
	if err != nil {
		return err
	}
	pgCtl, err := findBin("pg_ctl")
	if err != nil {
		return err
	}
	p.as, p.pgCtl = as, pgCtl
	return nil
}
