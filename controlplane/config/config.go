// Package config owns the controlplane's configuration: the typed struct with
// the documented keys (controlplane.*, database.postgres.*, database.redis.*,
// worker.*, imageService.*), the defaults (applied in one place, WithDefaults), the LEVERS9_*
// environment overrides, and Validate, whose errors name the key. It never
// opens connections or logs; secrets it holds are never formatted into
// errors. Keys are stable; new keys may be added.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// DefaultEncryptionKey is the key shipped with levers9. Running on it is
// allowed for development (with a warning) and refused when
// LEVERS9_REFUSE_DEFAULT_ENCRYPTION_KEY=true.
const DefaultEncryptionKey = "levers9-shipped-default-encryption-key-change-me"

// DefaultPostgresPassword is the password the shipped examples use.
const DefaultPostgresPassword = "password"

// Config is the whole controlplane configuration.
type Config struct {
	Controlplane Controlplane `yaml:"controlplane"`
	Database     Database     `yaml:"database"`
	Worker       Worker       `yaml:"worker"`
	// ImageService says where the platform's own images come from.
	ImageService ImageService `yaml:"imageService"`
	// Volumes says where volumes live (volumes.*).
	Volumes Volumes `yaml:"volumes"`
	// RefuseDefaultEncryptionKey makes the controlplane refuse to start on
	// DefaultEncryptionKey. Env: LEVERS9_REFUSE_DEFAULT_ENCRYPTION_KEY.
	RefuseDefaultEncryptionKey bool `yaml:"refuseDefaultEncryptionKey"`
}

// Controlplane holds the listeners and authentication settings.
type Controlplane struct {
	// Metrics says where /metrics is served (controlplane.metrics.*).
	Metrics Metrics `yaml:"metrics"`
	// GRPCAddr is the gRPC listen address (default ":1993").
	GRPCAddr string `yaml:"grpcAddr"`
	// RESTAddr is the REST gateway, health and agent downloads address
	// (default ":1994"); /metrics is served there only with a metrics token.
	RESTAddr string `yaml:"restAddr"`
	// TunnelAddr is where agents' tunnels arrive, UDP and TCP (default ":1995").
	TunnelAddr string `yaml:"tunnelAddr"`
	TLS        TLS    `yaml:"tls"`
	Auth       Auth   `yaml:"auth"`
	// LogLevel is debug, info, warn or error (default info).
	LogLevel string `yaml:"logLevel"`
	// PublicHost is the name or address machines use to reach this
	// controlplane; it goes into join scripts (default 127.0.0.1).
	PublicHost string `yaml:"publicHost"`
	// AgentBinariesDir holds prebuilt agents, levers9-agent-linux-amd64 and
	// so on (default: the controlplane executable's directory).
	AgentBinariesDir string `yaml:"agentBinariesDir"`
	// AgentDevBuilds lets the controlplane build the agent from source for a
	// platform with no prebuilt binary. Env: LEVERS9_AGENT_DEV_BUILDS.
	AgentDevBuilds bool `yaml:"agentDevBuilds"`
	// AgentCertTTL is how long agent certificates live (default 24h); agents
	// renew them before expiry.
	AgentCertTTL string `yaml:"agentCertTTL"`
	// JoinTTL is the default lifetime of join tokens (default 1h).
	JoinTTL string `yaml:"joinTTL"`
	// LostAgentGrace is how long a machine's tunnel may be gone before its
	// running attempts are marked lost and retried elsewhere (default 30s).
	LostAgentGrace string `yaml:"lostAgentGrace"`
	// TunnelMaxHandshakesPerSource caps the tunnel handshakes in progress
	// from one source address (an IPv6 /64), so one sender cannot take every
	// handshake slot; sessions are never capped per source, so a fleet
	// behind one NAT address gets in (default 64; raise it to the global
	// cap, 1024, behind a TCP balancer that hides agents' addresses).
	TunnelMaxHandshakesPerSource int `yaml:"tunnelMaxHandshakesPerSource"`
	// ReplicaSecret keys the MAC on everything replicas tell each other
	// through Redis (forwarded agent calls, presence records). Every replica
	// sharing a Redis must have the same one. Empty: a key derived from
	// database.postgres.encryptionKey (see ReplicaSecrets). Env:
	// LEVERS9_REPLICA_SECRET.
	ReplicaSecret string `yaml:"replicaSecret"`
	// PreviousReplicaSecrets are still accepted (never used to sign) during
	// a rotation. Env: LEVERS9_PREVIOUS_REPLICA_SECRETS.
	PreviousReplicaSecrets []string `yaml:"previousReplicaSecrets"`
}

// TLS names the controlplane's certificate; both empty means plaintext.
type TLS struct {
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// CAFile is the CA join scripts tell machines to trust; when empty and
	// the certificate is self-signed, the certificate itself.
	CAFile string `yaml:"caFile"`
}

// Auth holds authentication settings.
type Auth struct {
	// BootstrapSecret lets the first caller create the first workspace.
	// Env: LEVERS9_BOOTSTRAP_SECRET. Empty turns bootstrap off; otherwise
	// at least MinBootstrapSecretLen characters.
	BootstrapSecret string `yaml:"bootstrapSecret"`
}

// Metrics says where Prometheus metrics are served.
type Metrics struct {
	// Addr is the metrics listener, plain HTTP (default 127.0.0.1:1996);
	// "off" serves none. Env: LEVERS9_CONTROLPLANE_METRICS_ADDR.
	Addr string `yaml:"addr"`
	// Token, when set (at least MinBootstrapSecretLen characters), must be
	// sent as "Authorization: Bearer TOKEN" on every /metrics, and /metrics
	// is then also served on restAddr. Env: LEVERS9_CONTROLPLANE_METRICS_TOKEN.
	Token string `yaml:"token"`
	// WorkerInterval is how often agents send metrics snapshots over their
	// tunnel, told in each heartbeat answer (a duration of at least 1s;
	// default empty: each agent's --metrics-interval, 15s).
	WorkerInterval string `yaml:"workerInterval"`
	// WorkerExpiry is how long after an agent's last snapshot its series
	// leave /metrics (default 1m; at least twice the interval).
	WorkerExpiry string `yaml:"workerExpiry"`
	// WorkerMaxSeries caps the series kept per agent (default 2000); new
	// series over it are dropped, and a log line says so.
	WorkerMaxSeries int `yaml:"workerMaxSeries"`
}

// MetricsOff is the controlplane.metrics.addr that turns the metrics
// listener off.
const MetricsOff = "off"

// MinBootstrapSecretLen is the shortest bootstrap secret Validate accepts.
const MinBootstrapSecretLen = 32

// Database holds the Postgres and Redis settings.
type Database struct {
	Postgres Postgres `yaml:"postgres"`
	Redis    Redis    `yaml:"redis"`
}

// Postgres says how to reach Postgres and how rows are sealed.
type Postgres struct {
	Host     string `yaml:"host"`
	Port     int    `yaml:"port"`
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	Database string `yaml:"database"`
	SSLMode  string `yaml:"sslMode"`
	// EncryptionKey seals secrets at rest.
	EncryptionKey string `yaml:"encryptionKey"`
	// PreviousEncryptionKeys still open rows sealed before a rotation.
	PreviousEncryptionKeys []string `yaml:"previousEncryptionKeys"`
}

// Redis says how to reach Redis.
type Redis struct {
	Addr     string `yaml:"addr"`
	Password string `yaml:"password"`
	DB       int    `yaml:"db"`
}

// Load reads a YAML configuration, applies the LEVERS9_* overrides from env
// (nil means none), the defaults, and validates. Unknown keys are errors, so
// a typo never silently does nothing.
func Load(r io.Reader, env func(string) (string, bool)) (*Config, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var c Config
	if len(bytes.TrimSpace(data)) > 0 {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("parse config: %w", err)
		}
	}
	if env != nil {
		if err := ApplyEnv(&c, env); err != nil {
			return nil, err
		}
	}
	c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// LoadFile is Load on a file; an empty path means no file (defaults and env).
func LoadFile(path string, env func(string) (string, bool)) (*Config, error) {
	if path == "" {
		return Load(bytes.NewReader(nil), env)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open config: %w", err)
	}
	defer f.Close()
	c, err := Load(f, env)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// WithDefaults fills every unset key with its default. It is the only place
// defaults live.
func (c *Config) WithDefaults() {
	cp := &c.Controlplane
	setDefault(&cp.GRPCAddr, ":1993")
	setDefault(&cp.RESTAddr, ":1994")
	setDefault(&cp.TunnelAddr, ":1995")
	setDefault(&cp.LogLevel, "info")
	setDefault(&cp.PublicHost, "127.0.0.1")
	setDefault(&cp.AgentCertTTL, "24h")
	setDefault(&cp.JoinTTL, "1h")
	setDefault(&cp.LostAgentGrace, "30s")
	setDefault(&cp.Metrics.Addr, "127.0.0.1:1996")
	setDefault(&cp.Metrics.WorkerExpiry, "1m")
	if cp.Metrics.WorkerMaxSeries == 0 {
		cp.Metrics.WorkerMaxSeries = 2000
	}
	if sw := &c.Volumes.SeaweedFS; sw.FilerURL == "" && sw.FilerAddr != "" {
		// weed's host:port.grpcPort: the HTTP port is before the dot.
		host, port := sw.FilerAddr, ""
		if i := strings.LastIndex(sw.FilerAddr, ":"); i >= 0 {
			host, port = sw.FilerAddr[:i], sw.FilerAddr[i+1:]
		}
		port, _, _ = strings.Cut(port, ".")
		sw.FilerURL = "http://" + host + ":" + port
	}
	pg := &c.Database.Postgres
	setDefault(&pg.Host, "127.0.0.1")
	if pg.Port == 0 {
		pg.Port = 5432
	}
	setDefault(&pg.User, "levers9")
	setDefault(&pg.Password, DefaultPostgresPassword)
	setDefault(&pg.Database, "levers9")
	setDefault(&pg.SSLMode, "disable")
	setDefault(&pg.EncryptionKey, DefaultEncryptionKey)
	setDefault(&c.Database.Redis.Addr, "127.0.0.1:6379")
	c.Worker.withDefaults()
}

func setDefault(s *string, v string) {
	if *s == "" {
		*s = v
	}
}

// Volumes configures the filesystems behind volumes.
type Volumes struct {
	// SeaweedFS is the cluster behind the seaweedfs driver
	// (volumes.seaweedfs.*); without a filer, creating a seaweedfs volume
	// is refused.
	SeaweedFS SeaweedFS `yaml:"seaweedfs"`
}

// SeaweedFS points at a SeaweedFS filer (its metadata in the controlplane's
// Postgres, see internal/seaweed).
type SeaweedFS struct {
	// FilerAddr is host:port.grpcPort, what agents' `weed mount` dials.
	// Env: LEVERS9_VOLUMES_SEAWEEDFS_FILERADDR.
	FilerAddr string `yaml:"filerAddr"`
	// FilerURL is the filer's HTTP URL, what the controlplane creates,
	// deletes and measures volumes through (default http://HOST:PORT of
	// FilerAddr). Env: LEVERS9_VOLUMES_SEAWEEDFS_FILERURL.
	FilerURL string `yaml:"filerURL"`
	// SecurityDir holds the cluster's credentials, 0600 files that
	// internal/seaweed generates (make up writes
	// .levers9-dev/seaweedfs/security): the controlplane signs its filer
	// requests with the filer's JWT keys, and pushes the mount client
	// certificate, key, CA and volume read key to the agent with each
	// attempt that mounts a volume. Required with filerAddr; read at start.
	// Env: LEVERS9_VOLUMES_SEAWEEDFS_SECURITYDIR.
	SecurityDir string `yaml:"securityDir"`
}
