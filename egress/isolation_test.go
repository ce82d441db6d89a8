package egress

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/levers9/levers9/internal/errdefs"
)

// TestPortIsolation checks the layer-2 backstop: every container port is
// isolated, and a container that routes its neighbour on-link (skipping the
// gateway and the egress chains) still cannot reach it, in observe mode too.
func TestPortIsolation(t *testing.T) {
	w := newWorld(t)
	nb := setupNode(t, w, w.config(ModeObserve))
	node := filepath.Base(w.nodeNS)
	for _, id := range []string{"ctr-a", "ctr-b"} {
		veth := names{w.prefix}.hostVeth(keyOf(id))
		if out := run(t, "ip", "-n", node, "-d", "link", "show", veth); !strings.Contains(out, "isolated on") {
			t.Errorf("%s: bridge port not isolated:\n%s", veth, out)
		}
	}
	if !nb.node.BridgeNetfilter() {
		t.Log("br_netfilter absent here: bridged frames skip iptables (reported by BridgeNetfilter)")
	} else if out := run(t, "ip", "netns", "exec", node, "sysctl", "-n", "net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables"); out != "1\n1\n" {
		t.Errorf("bridge-nf-call sysctls = %q", out)
	}
	if out := run(t, "ip", "netns", "exec", filepath.Base(nb.a.NetnsPath), "sysctl", "-n", "net.ipv4.ping_group_range"); strings.Join(strings.Fields(out), " ") != "0 2147483647" {
		t.Errorf("ping_group_range = %q", out)
	}
	// Through the gateway: refused (hairpin blocked) even in observe.
	if _, err := probe(nb.a.NetnsPath, "tcp", nb.b.IPv4.String()+":"+ctrPort); err == nil {
		t.Error("container b reachable through the gateway")
	}
	// On-link, straight across the bridge.
	ctrNS := filepath.Base(nb.a.NetnsPath)
	run(t, "ip", "-n", ctrNS, "route", "add", nb.b.IPv4.String()+"/32", "dev", "eth0")
	run(t, "ip", "-n", ctrNS, "-6", "route", "add", nb.b.IPv6.String()+"/128", "dev", "eth0")
	if _, err := probe(nb.a.NetnsPath, "tcp", nb.b.IPv4.String()+":"+ctrPort); err == nil {
		t.Error("container b reachable on-link across the bridge")
	}
	if _, err := probe(nb.a.NetnsPath, "tcp", "["+nb.b.IPv6.String()+"]:"+ctrPort); err == nil {
		t.Error("container b reachable on-link across the bridge over IPv6")
	}
	// A container cannot pass as another, nor use an address it was not
	// given: the node drops such packets (observe mode too).
	run(t, "ip", "-n", ctrNS, "addr", "add", "10.209.0.200/32", "dev", "eth0")
	if nb.node.BridgeNetfilter() {
		run(t, "ip", "-n", ctrNS, "addr", "add", nb.b.IPv4.String()+"/32", "dev", "eth0")
	}
	if reply, err := probeFrom(nb.a.NetnsPath, "10.209.0.200", "203.0.113.10:80"); err == nil {
		t.Errorf("from an address it was not given: reached public: %q", reply)
	}
	if nb.node.BridgeNetfilter() {
		// Posing as b: the packet must not be judged (or counted) as b's.
		_, _ = probeFrom(nb.a.NetnsPath, nb.b.IPv4.String(), "169.254.169.254:80")
		if err := nb.node.Collect(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(nb.node.matches.WithLabelValues("gpu", "task-b", ClassMetadata)); got != 0 {
			t.Errorf("a posing as b was counted as b: %v", got)
		}
	}
	if reply, err := probeFrom(nb.a.NetnsPath, nb.a.IPv4.String(), "203.0.113.10:80"); err != nil {
		t.Errorf("from its own address: %q %v", reply, err)
	}
	// Start and Stop repeatedly (the NFLOG reader and the loop).
	for i := 0; i < 5; i++ {
		nb.node.Stop()
		nb.node.Stop()
		if err := nb.node.Start(context.Background()); err != nil {
			t.Fatalf("restart %d: %v", i, err)
		}
	}
	// The node still reaches b (the check is not just "b is down").
	if reply, err := probe(w.nodeNS, "tcp", nb.b.IPv4.String()+":"+ctrPort); err != nil || !strings.HasPrefix(reply, "ok") {
		t.Errorf("node cannot reach container b: %q %v", reply, err)
	}
}

func TestNodeAPIErrors(t *testing.T) {
	t.Parallel()
	n, err := NewNode(Config{Resolvers: []string{"192.0.2.53"}, Prefix: "l9ex"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.Stop() // before Start: no-op
	n.Stop()
	if _, err := n.AddContainer(context.Background(), ContainerNet{ID: "x"}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("AddContainer before Setup: %v", err)
	}
	if _, err := n.AddContainer(context.Background(), ContainerNet{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("AddContainer without ID: %v", err)
	}
	if _, err := NewNode(Config{}, nil, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("NewNode with bad config: %v", err)
	}
}

// probeFrom dials from a chosen source address inside a namespace.
func probeFrom(nsPath, src, addr string) (string, error) {
	var reply string
	err := inNetns(nsPath, func() error {
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		reply = strings.TrimSpace(line)
		return err
	})
	return reply, err
}
