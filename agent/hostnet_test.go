package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/agent/taskrun"
	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/imagetest"
)

// TestBuildNodeHostNetwork: agents on one host, built as `levers9-agent
// run` builds them, one after the other with different machine IDs (a
// re-join after the old state directory was removed) and side by side.
// The re-joined agent removes the bridge the dead one left; the live
// one's stays; each gets its own subnet and NFLOG group; a task on each
// reaches the host over its own bridge; neither report is blind.
func TestBuildNodeHostNetwork(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc", "iptables", "ip")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	reg := imagetest.StartRegistry(t, imagetest.RegistryOptions{})
	if _, err := build.BuildBusybox(ctx, reg.Host, "l9h/busybox", "net", nil, build.Options{}); err != nil {
		t.Fatal(err)
	}
	hostDir := t.TempDir()
	suffix := fmt.Sprint(time.Now().UnixNano() % 100000)
	var prefixes []string
	t.Cleanup(func() {
		if err := egress.ReleaseHost(context.Background(), egress.HostConfig{Dir: hostDir}, prefixes, true); err != nil {
			t.Errorf("release: %v", err)
		}
	})
	// A host listener on every address: containers reach it through their
	// bridge's gateway.
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("host-answered\n"))
			_ = c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	build := func(id string) (*Node, NodeConfig) {
		t.Helper()
		cfg := NodeConfig{StateDir: t.TempDir(), MachineID: id, ImageRegistry: reg.Host, InsecureRegistries: []string{reg.Host},
			Resolvers: []string{"192.0.2.53"}, HostNet: egress.HostConfig{Dir: hostDir}}
		cfg = cfg.WithDefaults()
		prefixes = append(prefixes, cfg.Prefix)
		if err := imagetest.ReconcileMounts("levers9-" + cfg.Prefix); err != nil {
			t.Fatal(err)
		}
		n, err := BuildNode(ctx, cfg)
		if err != nil {
			t.Fatalf("build node %s: %v", id, err)
		}
		return n, cfg
	}
	hasBridge := func(prefix string) bool {
		return exec.Command("ip", "link", "show", prefix+"br").Run() == nil
	}
	runTask := func(n *Node, id string) {
		t.Helper()
		if err := n.Runner.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer n.Runner.Stop()
		var lines []string
		gw := n.Egress.Config().SubnetV4
		gwAddr := strings.TrimSuffix(strings.Split(gw, "/")[0], ".0") + ".1"
		res, err := n.Runner.Run(ctx, taskrun.Task{ID: id, Attempt: 1, Pool: "default", Image: "l9h/busybox:net",
			Args: []string{"sh", "-c", fmt.Sprintf("nc -w 5 %s %d </dev/null", gwAddr, port)}},
			taskrun.Output{Logs: taskrun.LogSinkFunc(func(_ context.Context, l taskrun.LogLine) error {
				lines = append(lines, l.Text)
				return nil
			})})
		if err != nil || res.State != taskrun.StateSucceeded || !strings.Contains(strings.Join(lines, "\n"), "host-answered") {
			t.Errorf("task %s on %s: %s %v, output %q", id, gw, res.State, err, lines)
		}
	}

	// The first agent runs, stops (its network stays, as an agent leaves it
	// for the next), and its state directory goes (rm -rf .levers9-dev).
	first, firstCfg := build("m_l9hfirst" + suffix)
	first.Close()
	if !hasBridge(firstCfg.Prefix) {
		t.Fatalf("the first agent made no bridge %sbr", firstCfg.Prefix)
	}
	if err := os.RemoveAll(firstCfg.StateDir); err != nil {
		t.Fatal(err)
	}

	// A re-join: a new machine ID. The dead agent's bridge goes.
	second, secondCfg := build("m_l9hsecond" + suffix)
	defer second.Close()
	if hasBridge(firstCfg.Prefix) {
		t.Errorf("the dead agent's bridge %sbr is still there", firstCfg.Prefix)
	}
	// Side by side: a live agent's network stays.
	third, thirdCfg := build("m_l9hthird" + suffix)
	defer third.Close()
	if !hasBridge(secondCfg.Prefix) || !hasBridge(thirdCfg.Prefix) {
		t.Errorf("a live agent's bridge is gone")
	}
	c2, c3 := second.Egress.Config(), third.Egress.Config()
	if c2.SubnetV4 == c3.SubnetV4 || c2.NFLOGGroup == c3.NFLOGGroup {
		t.Errorf("side by side agents share: %s/%d and %s/%d", c2.SubnetV4, c2.NFLOGGroup, c3.SubnetV4, c3.NFLOGGroup)
	}
	runTask(second, "hostnet2")
	runTask(third, "hostnet3")
	for _, n := range []*Node{second, third} {
		if rep := n.Egress.ReadinessReport("default"); rep.Blind != "" {
			t.Errorf("%s: report blind: %s", n.Egress.Config().Prefix, rep.Blind)
		}
	}
}
