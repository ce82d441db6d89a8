package seaweed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
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
	// Ports are the HTTP and gRPC ports of master, volume server and
	// filer. Zero picks a free one.
	MasterPort, VolumePort, FilerPort             int
	MasterGRPCPort, VolumeGRPCPort, FilerGRPCPort int
	// Postgres holds the filer's metadata.
	Postgres PostgresStore
	// VolumeSizeLimitMB caps each SeaweedFS volume file (not a levers9
	// volume): small ones let many collections share a small disk. 64 when 0.
	VolumeSizeLimitMB int
	Logger            *slog.Logger
}

// Cluster is a running single-node SeaweedFS, supervised by this process.
type Cluster struct {
	*Layout
	master, volume, filer *Process
}

// StartCluster starts master, volume server and filer, in that order,
// each waited for before the next, and returns once the filer answers and
// the cluster accepts writes. On error everything started is stopped.
func StartCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	l, err := NewLayout(o)
	if err != nil {
		return nil, err
	}
	if err := l.Prepare(); err != nil {
		return nil, err
	}
	c := &Cluster{Layout: l}
	for _, s := range l.Servers() {
		p := &Process{
			Name: "seaweedfs-" + s.Name, Bin: l.opts.Bin, Args: s.Args, Env: s.Env, Dir: s.Dir,
			LogPath: s.LogPath, Logger: l.opts.Logger, Restart: true,
		}
		switch s.Name {
		case "master":
			c.master = p
		case "volume":
			c.volume = p
		case "filer":
			c.filer = p
		}
		if err := p.Start(ctx); err != nil {
			c.Stop()
			return nil, err
		}
		done := p.Done()
		exited := func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		}
		if err := WaitReady(ctx, s, 90*time.Second, exited); err != nil {
			c.Stop()
			return nil, fmt.Errorf("starting SeaweedFS: %w", err)
		}
	}
	if err := c.WaitWritable(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
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
