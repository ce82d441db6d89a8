package agent

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/agent/taskrun"
	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/imagetest"
)

// TestNodeConfig: two machines get different prefixes (so two agents on
// one host never share containers, cgroups or bridges), and bad settings
// are reported together, each naming its flag.
func TestNodeConfig(t *testing.T) {
	a := NodeConfig{StateDir: "/var/lib/a", MachineID: "m_aaaa"}.WithDefaults()
	b := NodeConfig{StateDir: "/var/lib/b", MachineID: "m_bbbb"}.WithDefaults()
	if a.Prefix == b.Prefix || a.Validate() != nil || b.Validate() != nil {
		t.Errorf("prefixes %q and %q (valid: %v, %v): want two valid, different ones", a.Prefix, b.Prefix, a.Validate(), b.Validate())
	}
	if a.ImageRegistry != "index.docker.io" {
		t.Errorf("default registry %q", a.ImageRegistry)
	}
	// runsc pools run the pinned gVisor build when `make deps` installed
	// it, else the runsc on PATH; --runsc wins, and a bad one is refused
	// naming the flag.
	wantRunsc := "runsc"
	if st, err := os.Stat(PinnedRunsc); err == nil && st.Mode().Perm()&0o111 != 0 {
		wantRunsc = PinnedRunsc
	}
	if a.RunscPath != wantRunsc {
		t.Errorf("default runsc %q, want %q", a.RunscPath, wantRunsc)
	}
	if c := (NodeConfig{RunscPath: "/opt/runsc"}).WithDefaults(); c.RunscPath != "/opt/runsc" {
		t.Errorf("runsc %q, want the one given", c.RunscPath)
	}
	if err := runCmd(context.Background(), []string{"--runsc", "/nonexistent/runsc"}, nil, io.Discard); err == nil || !strings.Contains(err.Error(), "--runsc") {
		t.Errorf("run --runsc /nonexistent/runsc: %v, want an error naming --runsc", err)
	}
	err := NodeConfig{StateDir: "rel", Prefix: "L9-x"}.WithDefaults().Validate()
	if err == nil || !strings.Contains(err.Error(), "--state-dir") || !strings.Contains(err.Error(), "--prefix") {
		t.Errorf("bad config: %v, want both flags named", err)
	}
}

func TestHostResolvers(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	conf := "# systemd-resolved\nnameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver ::1\nnameserver fe80::1%eth0\nnameserver 2001:db8::1\nsearch example\n"
	if err := os.WriteFile(p, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := hostResolvers(p), []string{"10.0.0.2", "2001:db8::1"}; !slices.Equal(got, want) {
		t.Errorf("resolvers %q, want %q", got, want)
	}
	if got := hostResolvers(filepath.Join(t.TempDir(), "none")); got != nil {
		t.Errorf("missing file: %q", got)
	}
}

func TestControlplaneAllow(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want []string
	}{
		{"10.1.2.3:1993", []string{"10.1.2.3:1993/tcp"}},
		{"[2001:db8::1]:1993", []string{"[2001:db8::1]:1993/tcp"}},
		{"cp.example.com:1993", nil},
		{"127.0.0.1:1993", nil},
		{"nonsense", nil},
	} {
		got := controlplaneAllow(tc.addr)
		if !slices.Equal(got, tc.want) {
			t.Errorf("controlplaneAllow(%q) = %q, want %q", tc.addr, got, tc.want)
		}
		if _, err := egress.ParseAllow("test", got); err != nil {
			t.Errorf("controlplaneAllow(%q) is not a valid allow entry: %v", tc.addr, err)
		}
	}
}

// TestBuildNodeNoNetwork builds the Runner as `levers9-agent run` does
// (without the egress network, which would touch this host's namespace)
// and runs a task with it: the container's state, the image cache and the
// attempt records live under the state directory.
func TestBuildNodeNoNetwork(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg := imagetest.StartRegistry(t, imagetest.RegistryOptions{})
	img, err := build.BuildBusybox(ctx, reg.Host, "l9a/busybox", "node", nil, build.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := NodeConfig{StateDir: t.TempDir(), MachineID: "m_l9anode", NoNetwork: true,
		ImageRegistry: reg.Host, InsecureRegistries: []string{reg.Host}}
	prefix := cfg.WithDefaults().Prefix
	if err := imagetest.ReconcileMounts("levers9-" + prefix); err != nil {
		t.Fatal(err)
	}
	node, err := BuildNode(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if node.Egress != nil || node.Readiness() != nil {
		t.Error("NoNetwork built an egress node")
	}
	if err := node.Runner.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		node.Runner.Stop()
		if lost, err := node.Runner.Reconcile(context.Background()); err != nil || len(lost) != 0 {
			t.Errorf("reconcile after: %v, lost %v", err, lost)
		}
	})
	var lines []string
	var sawState bool
	out := taskrun.Output{
		Logs: taskrun.LogSinkFunc(func(_ context.Context, l taskrun.LogLine) error {
			lines = append(lines, l.Text)
			return nil
		}),
		Events: func(e taskrun.Event) {
			if e.Kind == taskrun.EventState && e.To == taskrun.StateRunning {
				_, err := os.Stat(filepath.Join(cfg.StateDir, "containers", prefix+"-node.1"))
				sawState = err == nil
			}
		},
	}
	res, err := node.Runner.Run(ctx, taskrun.Task{ID: "node", Attempt: 1, Pool: "default", Image: "l9a/busybox:node",
		Args: []string{"sh", "-c", "echo built"}}, out)
	if err != nil || res.State != taskrun.StateSucceeded || !slices.Equal(lines, []string{"built"}) || res.ImageDigest != img.Digest {
		t.Fatalf("Run = %s, %v, output %q, digest %s", res.State, err, lines, res.ImageDigest)
	}
	if !sawState {
		t.Error("the container's state was not under the state directory while it ran")
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "images")); err != nil {
		t.Errorf("image cache not under the state directory: %v", err)
	}
	if _, ok := testenv.FindBinary("runsc"); ok {
		// The longest task ID under a long state directory: runtimes put
		// sockets under their root.
		id := strings.Repeat("r", 40)
		lines = nil
		res, err := node.Runner.Run(ctx, taskrun.Task{ID: id, Attempt: 9999, Pool: "default", Image: "l9a/busybox:node",
			Args: []string{"sh", "-c", "echo gvisor"}, Security: sandbox.Security{Runtime: sandbox.RuntimeRunsc}}, taskrun.Output{Logs: out.Logs})
		if err != nil || res.State != taskrun.StateSucceeded || !slices.Equal(lines, []string{"gvisor"}) {
			t.Errorf("runsc Run = %s, %v, output %q", res.State, err, lines)
		}
	}
}
