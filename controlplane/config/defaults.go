package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"
)

// DefaultWarning names a shipped default the controlplane is running on.
type DefaultWarning struct {
	Key     string
	Message string
}

// ShippedDefaults lists each shipped default in use, one warning each: the
// shipped encryption key, the Postgres password "password", Redis without a
// password.
func (c *Config) ShippedDefaults() []DefaultWarning {
	var w []DefaultWarning
	if c.Database.Postgres.EncryptionKey == DefaultEncryptionKey {
		w = append(w, DefaultWarning{"database.postgres.encryptionKey",
			"running on the shipped encryption key: anyone with the levers9 source can open sealed secrets; set a key of your own"})
	}
	if c.Database.Postgres.Password == DefaultPostgresPassword {
		w = append(w, DefaultWarning{"database.postgres.password",
			`running on the shipped Postgres password "password"`})
	}
	if c.Database.Redis.Password == "" {
		w = append(w, DefaultWarning{"database.redis.password", "Redis has no password"})
	}
	return w
}

// ErrDefaultKeyRefused is returned when the shipped key is in use and
// refuseDefaultEncryptionKey is set.
var ErrDefaultKeyRefused = errors.New("database.postgres.encryptionKey is the shipped default and LEVERS9_REFUSE_DEFAULT_ENCRYPTION_KEY=true: set database.postgres.encryptionKey (or LEVERS9_ENCRYPTION_KEY) to a key of your own")

// CheckStartable returns why the controlplane must not start on this
// configuration, or nil. It validates again, so a config changed after Load
// is checked too.
func (c *Config) CheckStartable() error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.RefuseDefaultEncryptionKey && c.Database.Postgres.EncryptionKey == DefaultEncryptionKey {
		return ErrDefaultKeyRefused
	}
	return nil
}

// ConnString is the pgx connection string. It holds the password: never
// log it.
func (p Postgres) ConnString() string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(p.User, p.Password),
		Host:     net.JoinHostPort(p.Host, strconv.Itoa(p.Port)),
		Path:     "/" + p.Database,
		RawQuery: url.Values{"sslmode": {p.SSLMode}}.Encode(),
	}
	return u.String()
}

// ReplicaSecrets returns the secret replica messages are signed with and
// the ones still accepted. With controlplane.replicaSecret empty they are
// database.postgres.encryptionKey and its previous keys (derived=true): the
// encryption key is shared by every replica anyway, but a dedicated secret
// keeps the two apart and is recommended when replicas share Redis.
func (c *Config) ReplicaSecrets() (current string, previous []string, derived bool) {
	cp, pg := c.Controlplane, c.Database.Postgres
	if cp.ReplicaSecret != "" {
		return cp.ReplicaSecret, cp.PreviousReplicaSecrets, false
	}
	previous = append(append([]string(nil), cp.PreviousReplicaSecrets...), pg.PreviousEncryptionKeys...)
	return pg.EncryptionKey, previous, true
}

// CertTTL is controlplane.agentCertTTL parsed (Validate checked it).
func (c Controlplane) CertTTL() time.Duration {
	d, _ := time.ParseDuration(c.AgentCertTTL)
	return d
}

// JoinTokenTTL is controlplane.joinTTL parsed (Validate checked it).
func (c Controlplane) JoinTokenTTL() time.Duration {
	d, _ := time.ParseDuration(c.JoinTTL)
	return d
}

// LostGrace is controlplane.lostAgentGrace parsed (Validate checked it).
func (c Controlplane) LostGrace() time.Duration {
	d, _ := time.ParseDuration(c.LostAgentGrace)
	return d
}

// WorkerMetricsInterval is controlplane.metrics.workerInterval parsed
// (Validate checked it); 0 leaves the interval to each agent.
func (m Metrics) WorkerMetricsInterval() time.Duration {
	d, _ := time.ParseDuration(m.WorkerInterval)
	return d
}

// WorkerMetricsExpiry is controlplane.metrics.workerExpiry parsed
// (Validate checked it).
func (m Metrics) WorkerMetricsExpiry() time.Duration {
	d, _ := time.ParseDuration(m.WorkerExpiry)
	return d
}

// Redacted describes where Postgres is without the password.
func (p Postgres) Redacted() string {
	return fmt.Sprintf("postgres://%s@%s/%s", p.User, net.JoinHostPort(p.Host, strconv.Itoa(p.Port)), p.Database)
}
