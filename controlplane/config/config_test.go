package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/seaweed"
)

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLoadDefaults(t *testing.T) {
	t.Parallel()
	c, err := Load(strings.NewReader(""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Controlplane.GRPCAddr != ":1993" || c.Controlplane.RESTAddr != ":1994" || c.Controlplane.TunnelAddr != ":1995" {
		t.Errorf("ports = %+v", c.Controlplane)
	}
	// The secure defaults (see CHANGELOG.md before changing any).
	if cs := c.Worker.ContainerSecurity; cs.Profile != "hardened" || cs.Seccomp != "enforce" || !*cs.DropNetRaw ||
		!*cs.BridgePortIsolation || cs.Egress.Mode != "enforce" {
		t.Errorf("security defaults = %+v, egress %+v", cs, cs.Egress)
	}
	if _, ok := c.Worker.Pools["default"]; !ok {
		t.Error("default pool missing")
	}
	if got := len(c.ShippedDefaults()); got != 3 {
		t.Errorf("shipped defaults warnings = %d, want 3", got)
	}
}

func TestLoadFileAndEnv(t *testing.T) {
	t.Parallel()
	yml := `
controlplane:
  grpcAddr: 127.0.0.1:7000
  auth:
    bootstrapSecret: from-file-from-file-from-file-from-file
database:
  postgres:
    encryptionKey: aaaaaaaaaaaaaaaaaaaaaaaa
    previousEncryptionKeys: [bbbbbbbbbbbbbbbbbbbbbbbb]
  redis:
    password: r3dis
worker:
  containerSecurity:
    egress:
      allow: ["10.0.0.0/8:443/tcp", "[fd00::/8]:53"]
  pools:
    l40s:
      runtime: runsc
      security:
        seccomp: log
    ops:
      shared: true
    research:
      shared: true
      workspaces: [ws_abcdefghij, research]
`
	c, err := Load(strings.NewReader(yml), envMap(map[string]string{
		"LEVERS9_BOOTSTRAP_SECRET":              "from-env-from-env-from-env-from-env",
		"LEVERS9_DATABASE_POSTGRES_PORT":        "6543",
		"LEVERS9_REFUSE_DEFAULT_ENCRYPTION_KEY": "true",
		"LEVERS9_DATABASE_POSTGRES_PASSWORD":    "pw",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Controlplane.Auth.BootstrapSecret != "from-env-from-env-from-env-from-env" {
		t.Errorf("env must override the file, got %q", c.Controlplane.Auth.BootstrapSecret)
	}
	if c.Database.Postgres.Port != 6543 || !c.RefuseDefaultEncryptionKey {
		t.Errorf("env overrides lost: %+v", c.Database.Postgres.Port)
	}
	if w := c.ShippedDefaults(); len(w) != 0 {
		t.Errorf("no shipped defaults in use, got %v", w)
	}
	if err := c.CheckStartable(); err != nil {
		t.Errorf("own key must start: %v", err)
	}
	eff := c.Worker.EffectiveSecurity("l40s")
	if eff.Seccomp != "log" || eff.Profile != "hardened" || len(eff.Egress.Allow) != 2 {
		t.Errorf("effective security = %+v", eff)
	}
	if c.Worker.Pools["l40s"].Runtime != "runsc" || c.Worker.Pools["default"].Runtime != "runc" {
		t.Errorf("pool runtimes = %+v", c.Worker.Pools)
	}
	pools := c.Worker.Pools
	for _, tc := range []struct {
		pool, id, name string
		want           bool
	}{
		{"default", "ws_x", "x", false}, // not shared unless declared
		{"ops", "ws_x", "x", true},
		{"research", "ws_abcdefghij", "other", true}, // by ID
		{"research", "ws_y", "research", true},       // by name
		{"research", "ws_x", "x", false},
	} {
		if got := pools[tc.pool].SharedWith(tc.id, tc.name); got != tc.want {
			t.Errorf("pool %s SharedWith(%s, %s) = %v, want %v", tc.pool, tc.id, tc.name, got, tc.want)
		}
	}
}

func TestValidateNamesEveryKey(t *testing.T) {
	t.Parallel()
	yml := `
controlplane:
  grpcAddr: nonsense
  logLevel: loud
  tls: {certFile: a.pem}
  tunnelMaxHandshakesPerSource: -1
database:
  postgres: {port: 70000, encryptionKey: short}
worker:
  volumeMountValidation: maybe
  containerSecurity:
    seccomp: sometimes
    egress:
      allow: ["10.0.0.0/8", "10.0.0.0/33", "1.2.3.4:99999", "[::1]:53/icmp", "host.example:80"]
  pools:
    Bad_Name: {runtime: kata}
    mine: {workspaces: [a]}
    ops: {shared: true, workspaces: [a, "no spaces", a]}
    eu: {nodeSelector: {"zone!": eu}, volumeMountValidation: sometimes}
`
	_, err := Load(strings.NewReader(yml), nil)
	if err == nil {
		t.Fatal("want errors")
	}
	for _, want := range []string{
		"controlplane.grpcAddr", "controlplane.logLevel", "controlplane.tls", "controlplane.tunnelMaxHandshakesPerSource",
		"database.postgres.port", "database.postgres.encryptionKey",
		"worker.volumeMountValidation", "worker.containerSecurity.seccomp",
		"worker.containerSecurity.egress.allow[1]", "worker.containerSecurity.egress.allow[2]",
		"worker.containerSecurity.egress.allow[3]", "worker.containerSecurity.egress.allow[4]",
		"worker.pools.Bad_Name", "worker.pools.Bad_Name.runtime",
		"worker.pools.mine.workspaces", "worker.pools.ops.workspaces[1]", "worker.pools.ops.workspaces[2]",
		"worker.pools.eu.nodeSelector", "worker.pools.eu.volumeMountValidation",
	} {
		if !strings.Contains(err.Error(), want+":") {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "allow[0]") {
		t.Errorf("valid entry reported: %v", err)
	}
}

func TestSecretsNeverInErrors(t *testing.T) {
	t.Parallel()
	const secret = "hunter2-very-secret-value"
	_, err := Load(strings.NewReader("database:\n  postgres:\n    encryptionKey: hunter2\n    password: "+secret+"\n    previousEncryptionKeys: [hunter2]\n"), envMap(map[string]string{
		"LEVERS9_DATABASE_REDIS_DB": secret,
	}))
	if err == nil {
		t.Fatal("want an error")
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("secret leaked into error: %v", err)
	}
}

func TestUnknownKeyRefused(t *testing.T) {
	t.Parallel()
	_, err := Load(strings.NewReader("controlplane:\n  grpcAdr: :1\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "grpcAdr") {
		t.Errorf("typo must be refused naming the key, got %v", err)
	}
}

func TestRefuseDefaultKey(t *testing.T) {
	t.Parallel()
	c, err := Load(strings.NewReader(""), envMap(map[string]string{"LEVERS9_REFUSE_DEFAULT_ENCRYPTION_KEY": "true"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckStartable(); !errors.Is(err, ErrDefaultKeyRefused) {
		t.Errorf("CheckStartable = %v, want refusal", err)
	}
}

func TestConnStringRedacted(t *testing.T) {
	t.Parallel()
	p := Postgres{Host: "db", Port: 5432, User: "u", Password: "s3cr3t", Database: "d", SSLMode: "disable"}
	if !strings.Contains(p.ConnString(), "s3cr3t") {
		t.Error("conn string needs the password")
	}
	if strings.Contains(p.Redacted(), "s3cr3t") {
		t.Error("redacted form leaks the password")
	}
}

func FuzzLoad(f *testing.F) {
	f.Add([]byte("controlplane:\n  grpcAddr: :1993\n"))
	f.Add([]byte("worker:\n  containerSecurity:\n    egress:\n      allow: [\"[::1]:53/udp\"]\n"))
	f.Add([]byte("database: {postgres: {port: 1}}"))
	f.Add([]byte("\x00\xff: ["))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Load(strings.NewReader(string(data)), nil)
		if err != nil {
			if c != nil {
				t.Fatal("config returned with an error")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("loaded config fails Validate: %v", err)
		}
		if c.Controlplane.GRPCAddr == "" || c.Database.Postgres.EncryptionKey == "" {
			t.Fatal("defaults not applied")
		}
	})
}

func TestReplicaSecrets(t *testing.T) {
	t.Parallel()
	const enc, old = "encryption-key-aaaaaaaa", "old-encryption-key-bbbbbbb"
	base := "database:\n  postgres:\n    encryptionKey: " + enc + "\n    previousEncryptionKeys: [" + old + "]\n"

	t.Run("derived from the encryption key when unset", func(t *testing.T) {
		c, err := Load(strings.NewReader(base), nil)
		if err != nil {
			t.Fatal(err)
		}
		cur, prev, derived := c.ReplicaSecrets()
		if cur != enc || !derived || len(prev) != 1 || prev[0] != old {
			t.Errorf("ReplicaSecrets = %q, %q, %v", cur, prev, derived)
		}
	})
	t.Run("a dedicated secret from the environment", func(t *testing.T) {
		c, err := Load(strings.NewReader(base), envMap(map[string]string{
			"LEVERS9_REPLICA_SECRET":           "replica-secret-0123456789abcdef0123",
			"LEVERS9_PREVIOUS_REPLICA_SECRETS": enc + ",another-old-replica-secret",
		}))
		if err != nil {
			t.Fatal(err)
		}
		cur, prev, derived := c.ReplicaSecrets()
		if cur != "replica-secret-0123456789abcdef0123" || derived || len(prev) != 2 || prev[0] != enc {
			t.Errorf("ReplicaSecrets = %q, %q, %v", cur, prev, derived)
		}
	})
	t.Run("bad secrets are named, never shown", func(t *testing.T) {
		const short = "too-short-replica-secret"
		_, err := Load(strings.NewReader(base+"controlplane:\n  replicaSecret: "+short+"\n  previousReplicaSecrets: [tiny, "+short+"]\n"), nil)
		if err == nil {
			t.Fatal("want errors")
		}
		for _, want := range []string{"controlplane.replicaSecret:", "controlplane.previousReplicaSecrets[0]:", "controlplane.previousReplicaSecrets[1]: is the current"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error does not say %q:\n%v", want, err)
			}
		}
		if strings.Contains(err.Error(), short) || strings.Contains(err.Error(), "tiny") {
			t.Errorf("a secret is in the error: %v", err)
		}
	})
}

func TestCheckLabel(t *testing.T) {
	t.Parallel()
	for _, ok := range [][2]string{{"zone", "eu"}, {"zone", ""}, {"example.com/gpu", "l40s"}, {"a", "A_b.c-9"}, {"k8s.io/z", "1"}} {
		if err := CheckLabel(ok[0], ok[1]); err != nil {
			t.Errorf("%s=%s: %v", ok[0], ok[1], err)
		}
	}
	for _, bad := range [][2]string{{"", "x"}, {"-zone", "x"}, {"zone", "x-"}, {"a b", "c"}, {"UP/zone", "x"}, {"/zone", "x"},
		{"a/b/c", "x"}, {strings.Repeat("k", 64), "x"}, {"zone", strings.Repeat("v", 64)}} {
		err := CheckLabel(bad[0], bad[1])
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("label %q", bad[0])) {
			t.Errorf("%q=%q: %v, want an error naming the label", bad[0], bad[1], err)
		}
	}
	if got := Unselected(map[string]string{"zone": "eu", "gpu": "l40s"}, map[string]string{"zone": "us"}); !slices.Equal(got, []string{"gpu=l40s", "zone=eu"}) {
		t.Errorf("Unselected = %v", got)
	}
}

// TestSeaweedFSSecurityDir: a filer needs the cluster's credentials, given
// by file or environment, and a directory that lacks them or holds them
// loosely is refused naming the files, never a key.
func TestSeaweedFSSecurityDir(t *testing.T) {
	t.Parallel()
	good := filepath.Join(t.TempDir(), "sec")
	sec, err := seaweed.EnsureSecurity(good)
	if err != nil {
		t.Fatal(err)
	}
	loose := filepath.Join(t.TempDir(), "loose")
	if _, err := seaweed.EnsureSecurity(loose); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(loose, "jwt-filer-write.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	const key = "volumes.seaweedfs.securityDir:"
	for _, c := range []struct {
		name, yml string
		env       map[string]string
		want      string // in the error; "" for none
	}{
		{"no volumes", "", nil, ""},
		{"filer without credentials", "volumes: {seaweedfs: {filerAddr: '127.0.0.1:8888.18888'}}", nil, key + " required with volumes.seaweedfs.filerAddr"},
		{"credentials without filer", "volumes: {seaweedfs: {securityDir: " + good + "}}", nil, key + " set without"},
		{"missing dir", "volumes: {seaweedfs: {filerAddr: '127.0.0.1:8888.18888', securityDir: /nonexistent/l9}}", nil, "/nonexistent/l9/ca.crt"},
		{"loose key", "volumes: {seaweedfs: {filerAddr: '127.0.0.1:8888.18888', securityDir: " + loose + "}}", nil, "jwt-filer-write.key: mode -rw-r--r--"},
		{"good", "volumes: {seaweedfs: {filerAddr: '127.0.0.1:8888.18888', securityDir: " + good + "}}", nil, ""},
		{"good by env", "volumes: {seaweedfs: {filerAddr: '127.0.0.1:8888.18888'}}", map[string]string{"LEVERS9_VOLUMES_SEAWEEDFS_SECURITYDIR": good}, ""},
	} {
		_, err := Load(strings.NewReader(c.yml), envMap(c.env))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		case err != nil && strings.Contains(err.Error(), sec.FilerWriteKey):
			t.Errorf("%s: a key in the error", c.name)
		}
	}
}
