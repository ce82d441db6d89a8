package config

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/seaweed"
	"github.com/levers9/levers9/sandbox"
)

var poolName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Validate reports every problem at once, each naming its key. Values of
// secret keys are never included.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	addr := func(key, v string) {
		if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
			bad(key, "%q is not HOST:PORT", v)
		}
	}
	cp := c.Controlplane
	addr("controlplane.grpcAddr", cp.GRPCAddr)
	addr("controlplane.restAddr", cp.RESTAddr)
	addr("controlplane.tunnelAddr", cp.TunnelAddr)
	if (cp.TLS.CertFile == "") != (cp.TLS.KeyFile == "") {
		bad("controlplane.tls", "certFile and keyFile go together")
	}
	oneOf(bad, "controlplane.logLevel", cp.LogLevel, "debug", "info", "warn", "error")
	for key, v := range map[string]string{"controlplane.agentCertTTL": cp.AgentCertTTL, "controlplane.joinTTL": cp.JoinTTL} {
		if d, err := time.ParseDuration(v); err != nil || d < time.Minute {
			bad(key, "%q is not a duration of at least 1m (like 24h)", v)
		}
	}
	if n := cp.TunnelMaxHandshakesPerSource; n < 0 || n > 1<<20 {
		bad("controlplane.tunnelMaxHandshakesPerSource", "%d is not in 0..1048576 (0: the default, 64)", n)
	}
	if d, err := time.ParseDuration(cp.LostAgentGrace); err != nil || d < 500*time.Millisecond {
		bad("controlplane.lostAgentGrace", "%q is not a duration of at least 500ms (like 30s)", cp.LostAgentGrace)
	}
	if n := len(cp.Auth.BootstrapSecret); n > 0 && n < MinBootstrapSecretLen {
		bad("controlplane.auth.bootstrapSecret", "must be at least %d characters (or empty to turn bootstrap off)", MinBootstrapSecretLen)
	}
	if cp.Metrics.Addr != MetricsOff {
		addr("controlplane.metrics.addr", cp.Metrics.Addr)
	}
	if n := len(cp.Metrics.Token); n > 0 && n < MinBootstrapSecretLen {
		bad("controlplane.metrics.token", "must be at least %d characters (or empty)", MinBootstrapSecretLen)
	}
	validateWorkerMetrics(bad, cp.Metrics)
	if cp.PublicHost == "" || strings.ContainsAny(cp.PublicHost, " /'\"$`") {
		bad("controlplane.publicHost", "%q is not a host name or address", cp.PublicHost)
	}
	if cp.ReplicaSecret != "" && len(cp.ReplicaSecret) < 32 {
		bad("controlplane.replicaSecret", "must be at least 32 characters")
	}
	// At least 16, not 32: the encryption key may be listed while moving
	// from the derived key to a dedicated secret.
	previousSecrets(bad, "controlplane.previousReplicaSecrets", "replicaSecret", cp.ReplicaSecret, cp.PreviousReplicaSecrets)

	pg := c.Database.Postgres
	if pg.Port < 1 || pg.Port > 65535 {
		bad("database.postgres.port", "%d is not a port", pg.Port)
	}
	oneOf(bad, "database.postgres.sslMode", pg.SSLMode, "disable", "allow", "prefer", "require", "verify-ca", "verify-full")
	if len(pg.EncryptionKey) < 16 {
		bad("database.postgres.encryptionKey", "must be at least 16 characters")
	}
	previousSecrets(bad, "database.postgres.previousEncryptionKeys", "encryptionKey", pg.EncryptionKey, pg.PreviousEncryptionKeys)
	addr("database.redis.addr", c.Database.Redis.Addr)
	if c.Database.Redis.DB < 0 {
		bad("database.redis.db", "%d is negative", c.Database.Redis.DB)
	}

	w := c.Worker
	validateRegistry(bad, "worker.imageRegistry", w.ImageRegistry, false)
	c.ImageService.validate(bad)
	validateSecurity(bad, &errs, "worker.containerSecurity", w.ContainerSecurity)
	oneOf(bad, "worker.volumeMountValidation", w.VolumeMountValidation, "log", "enforce")
	kube := false
	names := make([]string, 0, len(w.Pools))
	for n := range w.Pools {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		key := "worker.pools." + n
		if !poolName.MatchString(n) {
			bad(key, "pool names are lower-case letters, digits and dashes")
		}
		p := w.Pools[n]
		oneOf(bad, key+".runtime", p.Runtime, "runc", "runsc")
		validateSecurity(bad, &errs, key+".security", p.Security)
		validateWorkspaces(bad, key, p)
		if p.VolumeMountValidation != "" {
			oneOf(bad, key+".volumeMountValidation", p.VolumeMountValidation, "log", "enforce")
		}
		// The selector's labels follow the machines' label rules, so a
		// selector no machine could ever match is refused at load.
		errs = append(errs, CheckLabels(key+".nodeSelector", p.NodeSelector)...)
		validateKube(bad, key, p)
		if p.IsKubernetes() {
			kube = true
		}
	}
	if kube {
		validateKubeWorkers(bad, w)
	}
	validateSeaweedFS(bad, c.Volumes.SeaweedFS)
	return errors.Join(errs...)
}

// workspaceRef is a workspace ID (ws_...) or name, as the API accepts names.
var workspaceRef = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

func validateWorkspaces(bad func(string, string, ...any), key string, p Pool) {
	if len(p.Workspaces) > 0 && !p.IsShared() {
		bad(key+".workspaces", "limits who may use a shared pool; set %s.shared: true, or remove it (a machine of a pool that is not shared serves only the workspace that enrolled it)", key)
	}
	seen := map[string]bool{}
	for i, w := range p.Workspaces {
		k := fmt.Sprintf("%s.workspaces[%d]", key, i)
		switch {
		case !workspaceRef.MatchString(w):
			bad(k, "%q is not a workspace ID or name (letters, digits, '_', '.', '-'; up to 63)", w)
		case seen[w]:
			bad(k, "%q is listed twice", w)
		}
		seen[w] = true
	}
}

func validateSecurity(bad func(string, string, ...any), errs *[]error, key string, s ContainerSecurity) {
	if s.Profile != "" {
		oneOf(bad, key+".profile", s.Profile, "legacy", "hardened")
	}
	if s.Seccomp != "" {
		oneOf(bad, key+".seccomp", s.Seccomp, "off", "log", "enforce")
	}
	if s.Egress.Mode != "" {
		oneOf(bad, key+".egress.mode", s.Egress.Mode, "off", "observe", "enforce")
	}
	if s.ApparmorProfile != "" && !sandbox.ValidAppArmorProfile(s.ApparmorProfile) {
		bad(key+".apparmorProfile", "%q is not a profile name (%s)", s.ApparmorProfile, sandbox.AppArmorNameRule)
	}
	// The agent's egress package owns the allow syntax; parsing here makes
	// a bad entry fail at config load, each error naming key[i] and entry.
	if _, err := egress.ParseAllow(key+".egress.allow", s.Egress.Allow); err != nil {
		*errs = append(*errs, err)
	}
}

// previousSecrets checks the secrets kept during a rotation (key names
// the list, currentName the key they replace): at least 16 characters, and
// not the current one.
func previousSecrets(bad func(string, string, ...any), key, currentName, current string, previous []string) {
	for i, k := range previous {
		if len(k) < 16 {
			bad(fmt.Sprintf("%s[%d]", key, i), "must be at least 16 characters")
		}
		if k == current {
			bad(fmt.Sprintf("%s[%d]", key, i), "is the current %s", currentName)
		}
	}
}

func oneOf(bad func(string, string, ...any), key, v string, allowed ...string) {
	if !slices.Contains(allowed, v) {
		bad(key, "%q is not one of %v", v, allowed)
	}
}

// validateWorkerMetrics checks controlplane.metrics.worker*.
func validateWorkerMetrics(bad func(key, format string, args ...any), m Metrics) {
	every := time.Duration(0)
	if m.WorkerInterval != "" {
		d, err := time.ParseDuration(m.WorkerInterval)
		if err != nil || d < time.Second || d > time.Hour {
			bad("controlplane.metrics.workerInterval", "%q is not a duration from 1s to 1h (like 15s), or empty", m.WorkerInterval)
		} else {
			every = d
		}
	}
	if d, err := time.ParseDuration(m.WorkerExpiry); err != nil || d < 2*max(every, time.Second) {
		bad("controlplane.metrics.workerExpiry", "%q is not a duration of at least twice the workerInterval (like 1m)", m.WorkerExpiry)
	}
	if m.WorkerMaxSeries < 1 || m.WorkerMaxSeries > 1_000_000 {
		bad("controlplane.metrics.workerMaxSeries", "%d is not in 1..1000000", m.WorkerMaxSeries)
	}
}

// validateSeaweedFS checks that a configured filer comes with the
// cluster's credentials, and reads them (naming files, never keys).
func validateSeaweedFS(bad func(key, format string, args ...any), sw SeaweedFS) {
	const key = "volumes.seaweedfs.securityDir"
	switch {
	case sw.FilerAddr == "" && sw.SecurityDir == "":
	case sw.FilerAddr == "":
		bad(key, "set without volumes.seaweedfs.filerAddr")
	case sw.SecurityDir == "":
		bad(key, "required with volumes.seaweedfs.filerAddr: the directory of the SeaweedFS cluster's credentials (internal/seaweed writes it beside the cluster; make up's is .levers9-dev/seaweedfs/security), without which the filer refuses the controlplane")
	default:
		if _, err := seaweed.LoadSecurity(sw.SecurityDir); err != nil {
			bad(key, "%v", err)
		}
	}
}
