package e2e

import (
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// scrape GETs the controlplane's /metrics.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %d %v\n%s", resp.StatusCode, err, b)
	}
	return string(b)
}

// TestWorkerMetricsThroughTheTunnel: a task in an observe-mode pool that
// connects to the metadata address moves the agent's egress counter, and
// a scrape of the controlplane's metrics endpoint sees it, labelled with
// the machine and the pool, and the agent's start phases (image, network,
// create, start) are there too. The agents listen on no port: their metrics
// come as snapshots over their tunnel.
func TestWorkerMetricsThroughTheTunnel(t *testing.T) {
	w := setupTaskWorldWith(t, func(c *config.Config, _ *taskWorld) {
		c.Worker.ContainerSecurity.Egress.Mode = "observe"
		// Agents send snapshots every second instead of every 15.
		c.Controlplane.Metrics.WorkerInterval = "1s"
	})
	// A machine has a default route: without one the box drops the
	// container's packet to the metadata address before the egress chains
	// (in FORWARD) see it.
	for _, b := range w.boxes {
		ip(t, "-n", b.ns, "route", "add", "default", "via", b.hostIP)
	}
	addr := w.in.Server.MetricsAddr()
	if addr == "" {
		t.Fatal("no metrics endpoint")
	}
	// Both agents report, with their tunnel state, before any task ran.
	controlplanetest.Eventually(t, 30*time.Second, "both agents' tunnel state in the scrape", func() bool {
		return strings.Count(scrape(t, addr), "worker_tunnel_connected{") == 2
	})

	r := w.start(t, "run", "--", "sh", "-c", "nc -w 2 169.254.169.254 80 </dev/null; echo probed")
	if code := r.wait(t, 90*time.Second); code != 0 {
		so, se := r.out()
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
	}
	ts := w.tasks(t)
	if len(ts) == 0 || len(ts[0].Attempts) == 0 {
		t.Fatalf("tasks: %+v", ts)
	}
	task, machine := ts[0].ID, ts[0].Attempts[len(ts[0].Attempts)-1].MachineID
	re := regexp.MustCompile(`(?m)^worker_container_egress_matches_total\{([^}]*)\} (\S+)$`)
	var last, body string
	t.Cleanup(func() {
		if t.Failed() {
			so, se := r.out()
			t.Logf("task stdout:\n%s\nstderr:\n%s", so, se)
			for _, b := range w.boxes {
				out, _ := exec.Command("ip", "netns", "exec", b.ns, "iptables-save", "-c").CombinedOutput()
				t.Logf("%s iptables:\n%s", b.ns, out)
			}
			for _, l := range strings.Split(body, "\n") {
				if strings.HasPrefix(l, "worker_") || strings.HasPrefix(l, "levers9_") {
					t.Log(l)
				}
			}
		}
	})
	controlplanetest.Eventually(t, 30*time.Second, "the egress match in a scrape of the controlplane", func() bool {
		body = scrape(t, addr)
		for _, m := range re.FindAllStringSubmatch(body, -1) {
			labels := m[1]
			if strings.Contains(labels, `task="`+task+`"`) && strings.Contains(labels, `class="metadata"`) {
				last = m[0]
				v, _ := strconv.ParseFloat(m[2], 64)
				return v > 0 && strings.Contains(labels, `machine="`+machine+`"`) && strings.Contains(labels, `pool="default"`)
			}
		}
		return false
	})
	t.Logf("scraped: %s", last)

	// The agent that ran it says where its start went, phase by phase.
	phase := regexp.MustCompile(`(?m)^worker_task_start_phase_seconds_count\{([^}]*)\} (\S+)$`)
	seen := map[string]bool{}
	controlplanetest.Eventually(t, 30*time.Second, "the start's phases in a scrape of the controlplane", func() bool {
		body = scrape(t, addr)
		for _, m := range phase.FindAllStringSubmatch(body, -1) {
			if strings.Contains(m[1], `machine="`+machine+`"`) && m[2] != "0" {
				if i := strings.Index(m[1], `phase="`); i >= 0 {
					seen[strings.SplitN(m[1][i+len(`phase="`):], `"`, 2)[0]] = true
				}
			}
		}
		return seen["image"] && seen["network"] && seen["create"] && seen["start"]
	})
}
