package seaweed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Server is how to run one weed server of a single-node cluster. Its argv
// never holds a secret: the filer's Postgres password is in Env.
type Server struct {
	// Name is master, volume or filer.
	Name string
	// Args are weed's arguments (the subcommand first).
	Args []string
	// Env is added to the process's environment.
	Env []string
	// Dir is the working directory (the filer reads filer.toml there).
	Dir string
	// LogPath is where its output goes (Dir of the cluster/logs/NAME.log).
	LogPath string
	// ReadyURL answers with a status below 500 once the server is up.
	ReadyURL string
}

// Layout is a single-node cluster before it runs: the options with every
// default and port filled in, each server's command line, and the files
// they need. StartCluster runs one under its own supervision; make up
// (packaging/localstack) runs the same servers detached. A Layout is a
// value: nothing starts and nothing is written until Prepare.
type Layout struct {
	opts ClusterOptions
}

// NewLayout fills in o's defaults and picks a free port for every port
// left zero.
func NewLayout(o ClusterOptions) (*Layout, error) {
	if o.Bin == "" {
		return nil, errors.New("starting SeaweedFS: no weed binary given")
	}
	if o.Dir == "" {
		return nil, errors.New("starting SeaweedFS: no directory given")
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.VolumeSizeLimitMB == 0 {
		o.VolumeSizeLimitMB = 64
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	for _, p := range []*int{&o.MasterPort, &o.MasterGRPCPort, &o.VolumePort, &o.VolumeGRPCPort, &o.FilerPort, &o.FilerGRPCPort} {
		if *p == 0 {
			var err error
			if *p, err = freePort(o.Host); err != nil {
				return nil, fmt.Errorf("starting SeaweedFS: %w", err)
			}
		}
	}
	return &Layout{opts: o}, nil
}

// Options are the options with defaults and ports filled in.
func (l *Layout) Options() ClusterOptions { return l.opts }

// Prepare makes the data directories (0700) and writes the filer's
// config, filer.toml (0600, without the password).
func (l *Layout) Prepare() error {
	for _, d := range []string{"logs", "master", "volume", "filer"} {
		if err := os.MkdirAll(filepath.Join(l.opts.Dir, d), 0o700); err != nil {
			return fmt.Errorf("starting SeaweedFS: %w", err)
		}
	}
	p := l.FilerConfigPath()
	if err := os.WriteFile(p, []byte(l.FilerConfig()), 0o600); err != nil {
		return fmt.Errorf("writing the filer config %s: %w", p, err)
	}
	// WriteFile keeps the mode of a file that was there.
	if err := os.Chmod(p, 0o600); err != nil {
		return fmt.Errorf("writing the filer config %s: %w", p, err)
	}
	return nil
}

// FilerConfigPath is filer.toml in the filer's working directory, where
// weed looks for it.
func (l *Layout) FilerConfigPath() string { return filepath.Join(l.opts.Dir, "filer", "filer.toml") }

// FilerConfig is filer.toml: the Postgres store, without its password
// (that comes from WEED_POSTGRES_PASSWORD in the filer's environment).
func (l *Layout) FilerConfig() string {
	pg := l.opts.Postgres
	return fmt.Sprintf(`# written by levers9 (internal/seaweed); the password comes from WEED_POSTGRES_PASSWORD
[postgres]
enabled = true
createTable = true
hostname = %q
port = %d
username = %q
database = %q
schema = ""
sslmode = "disable"
connection_max_idle = 4
connection_max_open = 16
connection_max_lifetime_seconds = 300
enableUpsert = true
upsertQuery = """INSERT INTO "%%[1]s" (dirhash, name, directory, meta) VALUES($1, $2, $3, $4) ON CONFLICT (dirhash, name) DO UPDATE SET directory=EXCLUDED.directory, meta=EXCLUDED.meta"""
`, pg.Host, pg.Port, pg.User, pg.Database)
}

// Servers are master, volume server and filer, in the order they start.
func (l *Layout) Servers() []Server {
	o, h := l.opts, l.opts.Host
	logPath := func(name string) string { return filepath.Join(o.Dir, "logs", name+".log") }
	return []Server{{
		Name: "master", Dir: filepath.Join(o.Dir, "master"), LogPath: logPath("master"),
		Args: []string{"master", "-ip=" + h, "-ip.bind=" + h, "-port=" + itoa(o.MasterPort), "-port.grpc=" + itoa(o.MasterGRPCPort),
			"-mdir=" + filepath.Join(o.Dir, "master"), "-volumeSizeLimitMB=" + itoa(o.VolumeSizeLimitMB),
			"-defaultReplication=000"},
		// One SeaweedFS volume per growth, not seven: every levers9 volume
		// is a collection of its own, and seven files each would fill a
		// node's limit.
		Env:      []string{"WEED_MASTER_VOLUME_GROWTH_COPY_1=1"},
		ReadyURL: fmt.Sprintf("http://%s/cluster/status", net.JoinHostPort(h, itoa(o.MasterPort))),
	}, {
		Name: "volume", Dir: filepath.Join(o.Dir, "volume"), LogPath: logPath("volume"),
		Args: []string{"volume", "-ip=" + h, "-ip.bind=" + h, "-port=" + itoa(o.VolumePort), "-port.grpc=" + itoa(o.VolumeGRPCPort),
			"-dir=" + filepath.Join(o.Dir, "volume"), "-max=0", "-master=" + l.MasterAddr(), "-minFreeSpace=1",
			// The default waits 10s after SIGTERM for the master to notice;
			// with one node there is no one to hand over to.
			"-preStopSeconds=0"},
		ReadyURL: fmt.Sprintf("http://%s/status", net.JoinHostPort(h, itoa(o.VolumePort))),
	}, {
		Name: "filer", Dir: filepath.Join(o.Dir, "filer"), LogPath: logPath("filer"),
		Args: []string{"filer", "-ip=" + h, "-ip.bind=" + h, "-port=" + itoa(o.FilerPort), "-port.grpc=" + itoa(o.FilerGRPCPort),
			"-master=" + l.MasterAddr(), "-defaultReplicaPlacement=000"},
		// The Postgres password goes in the environment, never in argv or
		// the config file; viper maps WEED_POSTGRES_PASSWORD to
		// postgres.password.
		Env:      []string{"WEED_POSTGRES_PASSWORD=" + o.Postgres.Password},
		ReadyURL: l.FilerURL() + "/",
	}}
}

// MasterAddr is the master's address in weed's host:port.grpcPort form.
func (l *Layout) MasterAddr() string {
	return net.JoinHostPort(l.opts.Host, itoa(l.opts.MasterPort)) + "." + itoa(l.opts.MasterGRPCPort)
}

// FilerAddr is the filer's address in weed's host:port.grpcPort form, what
// `weed mount -filer` takes.
func (l *Layout) FilerAddr() string {
	return net.JoinHostPort(l.opts.Host, itoa(l.opts.FilerPort)) + "." + itoa(l.opts.FilerGRPCPort)
}

// FilerURL is the filer's HTTP base URL.
func (l *Layout) FilerURL() string {
	return "http://" + net.JoinHostPort(l.opts.Host, itoa(l.opts.FilerPort))
}

// WaitReady waits until s answers on its ReadyURL, at most within.
// exited, when not nil, reports that the server is gone, which ends the
// wait early.
func WaitReady(ctx context.Context, s Server, within time.Duration, exited func() bool) error {
	deadline := time.Now().Add(within)
	client := &http.Client{Timeout: 2 * time.Second}
	var last error
	for time.Now().Before(deadline) {
		resp, err := client.Get(s.ReadyURL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return nil
			}
			err = fmt.Errorf("%s answered %s", s.ReadyURL, resp.Status)
		}
		last = err
		if exited != nil && exited() {
			return fmt.Errorf("SeaweedFS %s exited before answering on %s (log %s: %s)", s.Name, s.ReadyURL, s.LogPath, tailFile(s.LogPath, 1500))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("SeaweedFS %s: no answer on %s within %s: %v (log %s: %s)", s.Name, s.ReadyURL, within, last, s.LogPath, tailFile(s.LogPath, 1500))
}

// WaitWritable waits until the master can place a file: the volume server
// has registered and a volume can grow. Until then the first write of a
// mount would fail.
func (l *Layout) WaitWritable(ctx context.Context) error {
	url := fmt.Sprintf("http://%s/dir/assign?collection=levers9-ready", net.JoinHostPort(l.opts.Host, itoa(l.opts.MasterPort)))
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := client.Get(url)
		if err == nil {
			var b strings.Builder
			buf := make([]byte, 512)
			n, _ := resp.Body.Read(buf)
			b.Write(buf[:n])
			resp.Body.Close()
			last = b.String()
			if resp.StatusCode == http.StatusOK && strings.Contains(last, `"fid"`) {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for SeaweedFS to accept writes: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("waiting for SeaweedFS to accept writes: none after 90s (last answer: %s)", last)
}
