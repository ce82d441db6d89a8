package egress

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/levers9/levers9/internal/testenv"
)

// TestRuncContainer runs real runc containers in the namespaces the node
// attaches, the way the agent will (network namespace by path, resolv.conf
// bind-mounted, NET_RAW dropped), and checks egress from inside them.
func TestRuncContainer(t *testing.T) {
	testenv.RequireRoot(t)
	runc := testenv.RequireBinary(t, "runc", "busybox")
	w := newWorld(t)
	nb := setupNode(t, w, w.config(ModeEnforce))
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"bin", "etc", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, runc[1], filepath.Join(rootfs, "bin", "busybox"), 0o755)
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "resolv.conf"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, runc[0], "spec", "--bundle", bundle)
	stateRoot := t.TempDir()
	for i, tc := range []struct {
		name string
		args []string
		want string // substring of the output
		fail bool   // the command must fail (with want in its output)
	}{
		{"public", []string{"/bin/busybox", "nc", "-w", "2", "203.0.113.10", "80"}, "ok 203.0.113.10:80", false},
		{"public v6", []string{"/bin/busybox", "nc", "-w", "2", "2001:db8::10", "80"}, "ok [2001:db8::10]:80", false},
		{"metadata", []string{"/bin/busybox", "nc", "-w", "2", "169.254.169.254", "80"}, "Connection refused", true},
		{"metadata v6", []string{"/bin/busybox", "nc", "-w", "2", "fd00:ec2::254", "80"}, "Connection refused", true},
		{"resolv.conf", []string{"/bin/busybox", "cat", "/etc/resolv.conf"}, "nameserver 192.0.2.53\nnameserver 2001:db8::53", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := w.prefix + "-runc" + string(rune('a'+i))
			writeSpec(t, bundle, tc.args, nb.a, id)
			cmd := exec.Command(runc[0], "--root", stateRoot, "run", "--bundle", bundle, id)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			_ = exec.Command(runc[0], "--root", stateRoot, "delete", "--force", id).Run()
			if (err != nil) != tc.fail || !strings.Contains(out.String(), tc.want) {
				t.Errorf("%v: err %v, output %q, want %q (fail=%v)", tc.args, err, out.String(), tc.want, tc.fail)
			}
		})
	}
	if err := nb.node.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(nb.node.matches.WithLabelValues("gpu", "task-a", ClassMetadata)); got != 2 {
		t.Errorf("metadata matches from the runc containers = %v, want 2", got)
	}
}

func writeSpec(t *testing.T, bundle string, args []string, att *Attachment, id string) {
	t.Helper()
	path := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	spec.Process.Terminal = false
	spec.Process.Args = args
	spec.Process.NoNewPrivileges = true
	caps := []string{"CAP_KILL", "CAP_AUDIT_WRITE"} // no CAP_NET_RAW
	spec.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	spec.Root.Readonly = true
	spec.Hostname = id
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: att.ResolvConfPath, Options: []string{"rbind", "ro"}})
	for i, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			spec.Linux.Namespaces[i].Path = att.NetnsPath
		}
	}
	spec.Linux.CgroupsPath = "/" + id
	b, err = json.Marshal(&spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
