package juicefs

import (
	"slices"
	"strings"
	"testing"

	"github.com/levers9/levers9/volumes"
)

const pw = "s3cr3t-meta-pw"

func testDriver() *Driver {
	return New(Config{
		MetaURL: "postgres://jfs:" + pw + "@db.internal:5432/jfs_ws1?sslmode=disable",
		Storage: "s3", Bucket: "https://bkt.s3.example.com/ws1",
		AccessKey: "AKIAEXAMPLE", SecretKey: "secret-key-value",
		FSName: "ws1", CacheDir: "/var/cache/l9jfs",
	})
}

// noSecrets fails when a credential shows in argv.
func noSecrets(t *testing.T, args []string) {
	t.Helper()
	joined := strings.Join(args, " ")
	for _, s := range []string{pw, "secret-key-value", "AKIAEXAMPLE"} {
		if strings.Contains(joined, s) {
			t.Fatalf("argv holds a credential %q: %q", s, args)
		}
	}
}

func TestCommandsKeepSecretsInTheEnvironment(t *testing.T) {
	d := testDriver()
	v := volumes.Volume{ID: "vol_abc", Workspace: "ws1", QuotaBytes: 3<<30 + 1}
	format, err := d.FormatCmd()
	if err != nil {
		t.Fatal(err)
	}
	mount, err := d.MountCmd(v, "/mnt/l9/vol_abc", volumes.MountOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	quota, err := d.QuotaCmd(v)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cmd  Cmd
		want []string
	}{
		{"format", format, []string{"format", "--no-update", "--storage", "s3", "--bucket", "https://bkt.s3.example.com/ws1", "postgres://jfs@db.internal:5432/jfs_ws1?sslmode=disable", "ws1"}},
		{"mount", mount, []string{"mount", "--subdir", "/vol_abc", "--no-usage-report", "--cache-dir", "/var/cache/l9jfs", "--read-only", "postgres://jfs@db.internal:5432/jfs_ws1?sslmode=disable", "/mnt/l9/vol_abc"}},
		// 3 GiB and a byte rounds up to 4.
		{"quota", quota, []string{"quota", "set", "postgres://jfs@db.internal:5432/jfs_ws1?sslmode=disable", "--path", "/vol_abc", "--capacity", "4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			noSecrets(t, tt.cmd.Args)
			if !slices.Equal(tt.cmd.Args, tt.want) {
				t.Errorf("argv\n got %q\nwant %q", tt.cmd.Args, tt.want)
			}
			for _, e := range []string{"META_PASSWORD=" + pw, "ACCESS_KEY=AKIAEXAMPLE", "SECRET_KEY=secret-key-value"} {
				if !slices.Contains(tt.cmd.Env, e) {
					t.Errorf("env %q lacks %q", tt.cmd.Env, e)
				}
			}
		})
	}
}

func TestRedisURLWithoutUser(t *testing.T) {
	d := New(Config{MetaURL: "redis://:" + pw + "@127.0.0.1:6379/3", FSName: "ws"})
	c, err := d.MountCmd(volumes.Volume{ID: "v1", Workspace: "ws"}, "/mnt/x", volumes.MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	noSecrets(t, c.Args)
	if !slices.Contains(c.Args, "redis://127.0.0.1:6379/3") {
		t.Errorf("argv %q lacks the password-less URL", c.Args)
	}
	if !slices.Equal(c.Env, []string{"META_PASSWORD=" + pw}) {
		t.Errorf("env %q", c.Env)
	}
}

func TestBadInputsNeverEchoTheURL(t *testing.T) {
	d := New(Config{MetaURL: "::not a url " + pw})
	_, err := d.FormatCmd()
	if err == nil || strings.Contains(err.Error(), pw) {
		t.Fatalf("err = %v; want an error without the password", err)
	}
	if _, err := testDriver().MountCmd(volumes.Volume{ID: "../etc"}, "/mnt", volumes.MountOptions{}); err == nil {
		t.Fatal("a volume id with a path in it was accepted")
	}
}
