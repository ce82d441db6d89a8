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
	"strconv"
	"strings"
	"time"
)

// PostgresStore is where the filer keeps its metadata: a database of the
// controlplane's Postgres (the filer creates its one table, filemeta).
type PostgresStore struct {
	Host     string
	Port     int
	User     string
	Password string
	Database string
}

// ClusterOptions configures a single-node cluster: one master, one volume
// server, one filer, all on Host.
type ClusterOptions struct {
	// Bin is the weed binary (packaging/seaweedfs/build.sh).
	Bin string
	// Dir holds the data, the config and the logs (Dir/logs/NAME.log).
	Dir string
	// Host is the address every server binds and advertises; 127.0.0.1
	// when empty.
	Host string
	// Ports are the HTTP ports of master, volume server and filer; each
	// gRPC port is chosen free. Zero picks a free one.
	MasterPort, VolumePort, FilerPort int
	// Postgres holds the filer's metadata.
	Postgres PostgresStore
	// VolumeSizeLimitMB caps each SeaweedFS volume file (not a levers9
	// volume): small ones let many collections share a small disk. 64 when 0.
	VolumeSizeLimitMB int
	Logger            *slog.Logger
}

// Cluster is a running single-node SeaweedFS.
type Cluster struct {
	opts                              ClusterOptions
	master, volume, filer             *Process
	masterGRPC, volumeGRPC, filerGRPC int
}

// StartCluster starts master, volume server and filer, in that order,
// each waited for before the next, and returns once the filer answers.
// On error everything started is stopped.
func StartCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	if o.Bin == "" {
		return nil, errors.New("starting SeaweedFS: no weed binary given")
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
	c := &Cluster{opts: o}
	var err error
	for _, p := range []*int{&c.opts.MasterPort, &c.masterGRPC, &c.opts.VolumePort, &c.volumeGRPC, &c.opts.FilerPort, &c.filerGRPC} {
		if *p == 0 {
			if *p, err = freePort(o.Host); err != nil {
				return nil, fmt.Errorf("starting SeaweedFS: %w", err)
			}
		}
	}
	for _, d := range []string{"logs", "master", "volume", "filer"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("starting SeaweedFS: %w", err)
		}
	}
	if err := c.writeFilerConfig(); err != nil {
		return nil, err
	}
	h := o.Host
	c.master = c.process("master", filepath.Join(o.Dir, "master"), nil,
		"master", "-ip="+h, "-ip.bind="+h, "-port="+itoa(c.opts.MasterPort), "-port.grpc="+itoa(c.masterGRPC),
		"-mdir="+filepath.Join(o.Dir, "master"), "-volumeSizeLimitMB="+itoa(o.VolumeSizeLimitMB),
		"-defaultReplication=000")
	// One SeaweedFS volume per growth, not seven: every levers9 volume is a
	// collection of its own, and seven files each would fill a node's limit.
	c.master.Env = []string{"WEED_MASTER_VOLUME_GROWTH_COPY_1=1"}
	c.volume = c.process("volume", filepath.Join(o.Dir, "volume"), nil,
		"volume", "-ip="+h, "-ip.bind="+h, "-port="+itoa(c.opts.VolumePort), "-port.grpc="+itoa(c.volumeGRPC),
		"-dir="+filepath.Join(o.Dir, "volume"), "-max=0", "-master="+c.MasterAddr(), "-minFreeSpace=1",
		// The default waits 10s after SIGTERM for the master to notice;
		// with one node there is no one to hand over to.
		"-preStopSeconds=0")
	// The Postgres password goes in the environment, never in argv or the
	// config file; viper maps WEED_POSTGRES_PASSWORD to postgres.password.
	c.filer = c.process("filer", filepath.Join(o.Dir, "filer"),
		[]string{"WEED_POSTGRES_PASSWORD=" + o.Postgres.Password},
		"filer", "-ip="+h, "-ip.bind="+h, "-port="+itoa(c.opts.FilerPort), "-port.grpc="+itoa(c.filerGRPC),
		"-master="+c.MasterAddr(), "-defaultReplicaPlacement=000")

	steps := []struct {
		p   *Process
		url string
	}{
		{c.master, fmt.Sprintf("http://%s/cluster/status", net.JoinHostPort(h, itoa(c.opts.MasterPort)))},
		{c.volume, fmt.Sprintf("http://%s/status", net.JoinHostPort(h, itoa(c.opts.VolumePort)))},
		{c.filer, c.FilerURL() + "/"},
	}
	for _, s := range steps {
		if err := s.p.Start(ctx); err != nil {
			c.Stop()
			return nil, err
		}
		if err := waitHTTP(ctx, s.url, 90*time.Second, s.p); err != nil {
			c.Stop()
			return nil, fmt.Errorf("starting SeaweedFS %s: %w (log %s: %s)", s.p.Name, err, s.p.LogPath, tailFile(s.p.LogPath, 1500))
		}
	}
	if err := c.waitWritable(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) process(name, dir string, env []string, args ...string) *Process {
	return &Process{
		Name: "seaweedfs-" + name, Bin: c.opts.Bin, Args: args, Env: env, Dir: dir,
		LogPath: filepath.Join(c.opts.Dir, "logs", name+".log"),
		Logger:  c.opts.Logger, Restart: true,
	}
}

// writeFilerConfig writes filer.toml in the filer's working directory
// (weed looks for it there): the Postgres store, without its password.
func (c *Cluster) writeFilerConfig() error {
	pg := c.opts.Postgres
	conf := fmt.Sprintf(`# written by levers9 (internal/seaweed); the password comes from WEED_POSTGRES_PASSWORD
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
	p := filepath.Join(c.opts.Dir, "filer", "filer.toml")
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("writing the filer config %s: %w", p, err)
	}
	return nil
}

// waitWritable waits until the master can place a file: the volume server
// has registered and a volume can grow. Until then the first write of a
// mount would fail.
func (c *Cluster) waitWritable(ctx context.Context) error {
	url := fmt.Sprintf("http://%s/dir/assign?collection=levers9-ready", net.JoinHostPort(c.opts.Host, itoa(c.opts.MasterPort)))
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
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

// MasterAddr is the master's address in weed's host:port.grpcPort form.
func (c *Cluster) MasterAddr() string {
	return net.JoinHostPort(c.opts.Host, itoa(c.opts.MasterPort)) + "." + itoa(c.masterGRPC)
}

// FilerAddr is the filer's address in weed's host:port.grpcPort form, what
// `weed mount -filer` takes.
func (c *Cluster) FilerAddr() string {
	return net.JoinHostPort(c.opts.Host, itoa(c.opts.FilerPort)) + "." + itoa(c.filerGRPC)
}

// FilerURL is the filer's HTTP base URL.
func (c *Cluster) FilerURL() string {
	return "http://" + net.JoinHostPort(c.opts.Host, itoa(c.opts.FilerPort))
}

// Processes are the supervised servers: master, volume server, filer.
func (c *Cluster) Processes() []*Process { return []*Process{c.master, c.volume, c.filer} }

// Stop stops filer, volume server and master, in that order, and blocks
// until they have exited. Safe twice.
func (c *Cluster) Stop() error {
	var errs []error
	for _, p := range []*Process{c.filer, c.volume, c.master} {
		if p != nil {
			errs = append(errs, p.Stop())
		}
	}
	return errors.Join(errs...)
}

func waitHTTP(ctx context.Context, url string, within time.Duration, p *Process) error {
	deadline := time.Now().Add(within)
	client := &http.Client{Timeout: 2 * time.Second}
	var last error
	for time.Now().Before(deadline) {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return nil
			}
			err = fmt.Errorf("%s answered %s", url, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.Done():
			return fmt.Errorf("exited before answering on %s", url)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("no answer on %s within %s: %v", url, within, last)
}

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func itoa(i int) string { return strconv.Itoa(i) }

// tailFile returns up to the last n bytes of a log, for error messages.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
