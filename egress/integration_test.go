package egress

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/levers9/levers9/internal/testenv"
)

type nodeBundle struct {
	w    *world
	node *Node
	reg  *prometheus.Registry
	logs *logRecorder
	a, b *Attachment
}

// setupNode starts a Node in the world with two containers, a and b, and
// removes everything in t.Cleanup.
func setupNode(t *testing.T, w *world, cfg Config) *nodeBundle {
	t.Helper()
	ctx := context.Background()
	nb := &nodeBundle{w: w, reg: prometheus.NewRegistry(), logs: &logRecorder{}}
	n, err := NewNode(cfg, slogNew(nb.logs), nb.reg)
	if err != nil {
		t.Fatal(err)
	}
	nb.node = n
	t.Cleanup(func() {
		n.Stop()
		if err := n.Uninstall(context.Background()); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	if err := n.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if nb.a, err = n.AddContainer(ctx, ContainerNet{ID: "ctr-a", Task: "task-a", Pool: "gpu"}); err != nil {
		t.Fatal(err)
	}
	if nb.b, err = n.AddContainer(ctx, ContainerNet{ID: "ctr-b", Task: "task-b", Pool: "gpu"}); err != nil {
		t.Fatal(err)
	}
	// Container b listens, so a can try to reach it.
	w.serveTCP(t, nb.b.NetnsPath, ":"+ctrPort)
	return nb
}

type probeCase struct {
	name, network, addr string
	class               string // "" when always allowed
	dest                string // the destination the log reports
}

func probes(nb *nodeBundle) []probeCase {
	b4 := nb.b.IPv4.String()
	b6 := nb.b.IPv6.String()
	gw4 := nb.a.Gateway4.String()
	gw6 := nb.a.Gateway6.String()
	return []probeCase{
		{"public v4", "tcp", "203.0.113.10:80", "", ""},
		{"public v6", "tcp", "[2001:db8::10]:80", "", ""},
		{"resolver v4", "udp", "192.0.2.53:53", "", ""},
		{"resolver v6", "udp", "[2001:db8::53]:53", "", ""},
		{"controlplane", "tcp", "10.250.0.5:1995", "", ""},
		{"allowed private port", "tcp", "192.168.77.10:8080", "", ""},
		{"allowed ULA port", "tcp", "[fd12:3456::10]:8080", "", ""},
		{"metadata v4", "tcp", "169.254.169.254:80", ClassMetadata, "169.254.169.254:80/tcp"},
		{"metadata v6", "tcp", "[fd00:ec2::254]:80", ClassMetadata, "[fd00:ec2::254]:80/tcp"},
		{"azure wireserver", "tcp", "168.63.129.16:80", ClassMetadata, "168.63.129.16:80/tcp"},
		{"alibaba metadata", "tcp", "100.100.100.200:80", ClassMetadata, "100.100.100.200:80/tcp"},
		{"private v4", "tcp", "192.168.77.10:80", ClassPrivate, "192.168.77.10:80/tcp"},
		{"private ULA", "tcp", "[fd12:3456::10]:80", ClassPrivate, "[fd12:3456::10]:80/tcp"},
		{"shared", "tcp", "100.64.5.5:80", ClassShared, "100.64.5.5:80/tcp"},
		{"link-local", "tcp", "169.254.10.10:80", ClassLinkLocal, "169.254.10.10:80/tcp"},
		{"node uplink v4", "tcp", nodeUplink4 + ":" + nodePort, ClassNode, nodeUplink4 + ":" + nodePort + "/tcp"},
		{"node uplink v6", "tcp", "[" + nodeUplink6 + "]:" + nodePort, ClassNode, "[" + nodeUplink6 + "]:" + nodePort + "/tcp"},
		{"node gateway v4", "tcp", gw4 + ":" + nodePort, ClassNode, gw4 + ":" + nodePort + "/tcp"},
		{"node gateway v6", "tcp", "[" + gw6 + "]:" + nodePort, ClassNode, "[" + gw6 + "]:" + nodePort + "/tcp"},
		{"dns elsewhere", "udp", "203.0.113.10:53", ClassDNS, "203.0.113.10:53/udp"},
		{"dns elsewhere v6", "udp", "[2001:db8::10]:53", ClassDNS, "[2001:db8::10]:53/udp"},
		{"other container v4", "tcp", b4 + ":" + ctrPort, ClassContainer, b4 + ":" + ctrPort + "/tcp"},
		{"other container v6", "tcp", "[" + b6 + "]:" + ctrPort, ClassContainer, "[" + b6 + "]:" + ctrPort + "/tcp"},
	}
}

// TestEgressModes checks every reachability expectation from inside a
// container in observe and in enforce, with the counter, log line and
// readiness sample each refused (or would-be refused) attempt leaves.
func TestEgressModes(t *testing.T) {
	w := newWorld(t)
	for _, mode := range []Mode{ModeObserve, ModeEnforce} {
		t.Run(string(mode), func(t *testing.T) {
			nb := setupNode(t, w, w.config(mode, "192.168.77.10:8080/tcp", "[fd12:3456::10]:8080"))
			want := map[string]float64{}
			for _, pc := range probes(nb) {
				reply, err := probe(nb.a.NetnsPath, pc.network, pc.addr)
				// Port isolation refuses container to container in
				// both modes.
				allowed := pc.class == "" || mode == ModeObserve && pc.class != ClassContainer
				if allowed && (err != nil || !strings.HasPrefix(reply, "ok")) {
					t.Errorf("%s (%s %s): want reachable, got %q, %v", pc.name, pc.network, pc.addr, reply, err)
				}
				if !allowed && err == nil {
					t.Errorf("%s (%s %s): want refused, got %q", pc.name, pc.network, pc.addr, reply)
				}
				if pc.class != "" {
					want[pc.class]++
				}
			}
			// ICMP datagram ping works without NET_RAW (ping_group_range).
			for _, dst := range []string{"203.0.113.10", "2001:db8::10"} {
				if err := pingFrom(nb.a.NetnsPath, dst); err != nil {
					t.Errorf("datagram ping %s: %v", dst, err)
				}
			}
			ctx := context.Background()
			if err := nb.node.Collect(ctx); err != nil {
				t.Fatal(err)
			}
			for _, class := range Classes {
				got := testutil.ToFloat64(nb.node.matches.WithLabelValues("gpu", "task-a", class))
				if got != want[class] {
					t.Errorf("worker_container_egress_matches_total{pool=gpu,task=task-a,class=%s} = %v, want %v", class, got, want[class])
				}
			}
			if got := testutil.ToFloat64(nb.node.matches.WithLabelValues("gpu", "task-b", ClassMetadata)); got != 0 {
				t.Errorf("task-b metadata = %v, want 0 (misattributed)", got)
			}
			if n, err := testutil.GatherAndCount(nb.reg, "worker_container_egress_matches_total"); err != nil || n == 0 {
				t.Errorf("metric not on the registry: %d, %v", n, err)
			}
			verb := map[Mode]string{ModeObserve: "egress would refuse", ModeEnforce: "egress refused"}[mode]
			for _, pc := range probes(nb) {
				if pc.class == "" {
					continue
				}
				msg := verb
				if pc.class == ClassContainer {
					msg = "egress refused"
				}
				testenv.Eventually(t, 5*time.Second, "log line for "+pc.name, func() bool {
					return nb.logs.find(msg, map[string]string{"class": pc.class, "destination": pc.dest, "task_id": "task-a", "pool": "gpu", "container_id": "ctr-a"})
				})
			}
			rep := nb.node.ReadinessReport("gpu")
			var total float64
			for _, v := range want {
				total += v
			}
			if float64(rep.Total) != total || rep.SafeToEnforce {
				t.Errorf("report total = %d safe=%v, want %v", rep.Total, rep.SafeToEnforce, total)
			}
			found := false
			for _, d := range rep.Destinations {
				if d.Class == ClassMetadata && d.Destination == "169.254.169.254:80/tcp" && d.Task == "task-a" {
					found = true
				}
			}
			if !found {
				t.Errorf("report lacks the metadata destination: %+v", rep.Destinations)
			}
			js, err := rep.JSON()
			var back Report
			if err != nil || json.Unmarshal(js, &back) != nil || back.Total != rep.Total {
				t.Errorf("report JSON round trip: %v", err)
			}
			if txt := rep.Text(); !strings.Contains(txt, "169.254.169.254:80/tcp") || !strings.Contains(txt, "task-a") {
				t.Errorf("report text:\n%s", txt)
			}
			if other := nb.node.ReadinessReport("cpu"); !other.SafeToEnforce {
				t.Errorf("pool cpu report not empty: %+v", other)
			}
		})
	}
}

func pingFrom(nsPath, dst string) error {
	v6 := strings.Contains(dst, ":")
	return inNetns(nsPath, func() error {
		network, laddr, proto := "udp4", "0.0.0.0", 1
		var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
		if v6 {
			network, laddr, proto = "udp6", "::", 58
			typ, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
		}
		c, err := icmp.ListenPacket(network, laddr)
		if err != nil {
			return err
		}
		defer c.Close()
		msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: 1, Seq: 1, Data: []byte("l9e")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(b, &net.UDPAddr{IP: net.ParseIP(dst)}); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 512)
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil {
			return err
		}
		if m.Type != reply {
			return &net.AddrError{Err: "unexpected ICMP type", Addr: dst}
		}
		return nil
	})
}

// TestPoolOverride runs a pool in enforce beside the node default
// (observe): each container gets its own pool's policy and allow list.
func TestPoolOverride(t *testing.T) {
	w := newWorld(t)
	nb := setupNode(t, w, w.config(ModeObserve))
	ctx := context.Background()
	strict := &SecurityConfig{BridgePortIsolation: true, Egress: EgressConfig{Mode: ModeEnforce, Allow: []string{"100.64.5.5:80/tcp"}}}
	c, err := nb.node.AddContainer(ctx, ContainerNet{ID: "ctr-c", Task: "task-c", Pool: "secure", Security: strict})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns, addr string
		ok       bool
	}{
		{nb.a.NetnsPath, "169.254.169.254:80", true}, // observe
		{c.NetnsPath, "169.254.169.254:80", false},   // enforce
		{c.NetnsPath, "100.64.5.5:80", true},         // the pool's allow list
		{nb.a.NetnsPath, "100.64.5.5:80", true},      // observe
		{c.NetnsPath, "[2001:db8::10]:80", true},
	} {
		_, err := probe(tc.ns, "tcp", tc.addr)
		if (err == nil) != tc.ok {
			t.Errorf("%s from %s: err = %v, want reachable=%v", tc.addr, filepath.Base(tc.ns), err, tc.ok)
		}
	}
	if err := nb.node.Collect(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(nb.node.matches.WithLabelValues("secure", "task-c", ClassMetadata)); got != 1 {
		t.Errorf("secure metadata = %v, want 1", got)
	}
	if got := testutil.ToFloat64(nb.node.matches.WithLabelValues("secure", "task-c", ClassShared)); got != 0 {
		t.Errorf("secure shared = %v, want 0 (allowed)", got)
	}
	if rep := nb.node.ReadinessReport("secure"); rep.Mode != ModeEnforce || rep.Total != 1 {
		t.Errorf("secure report: mode %s total %d", rep.Mode, rep.Total)
	}
	if rep := nb.node.ReadinessReport("gpu"); rep.Mode != ModeObserve || rep.Total != 2 {
		t.Errorf("gpu report: mode %s total %d", rep.Mode, rep.Total)
	}
	// A pool without isolation in observe: its container reaches b
	// through the gateway, counted as class container.
	open := &SecurityConfig{Egress: EgressConfig{Mode: ModeObserve}}
	e, err := nb.node.AddContainer(ctx, ContainerNet{ID: "ctr-e", Task: "task-e", Pool: "open", Security: open})
	if err != nil {
		t.Fatal(err)
	}
	if reply, err := probe(e.NetnsPath, "tcp", nb.b.IPv4.String()+":"+ctrPort); err != nil || !strings.HasPrefix(reply, "ok") {
		t.Errorf("open pool to b: %q %v", reply, err)
	}
	if _, err := probe(c.NetnsPath, "tcp", nb.b.IPv4.String()+":"+ctrPort); err == nil {
		t.Error("secure pool (isolated) reached b")
	}
	if err := nb.node.Collect(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(nb.node.matches.WithLabelValues("open", "task-e", ClassContainer)); got != 1 {
		t.Errorf("open pool container matches = %v, want 1", got)
	}
	bad := &SecurityConfig{Egress: EgressConfig{Mode: "block", Allow: []string{"1.2.3.4/40"}}}
	_, err = nb.node.AddContainer(ctx, ContainerNet{ID: "ctr-d", Pool: "bad", Security: bad})
	for _, want := range []string{`worker.pools.bad.security.egress.mode: "block"`, `worker.pools.bad.security.egress.allow[0]: "1.2.3.4/40": prefix length out of range`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad override error %v lacks %q", err, want)
		}
	}
}
