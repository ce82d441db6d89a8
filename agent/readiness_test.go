package agent

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/cli"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/egress"
)

// readiness adapts the egress aggregator the node uses to ReadinessSource.
type readiness struct{ r *egress.Readiness }

func (r readiness) ReadinessReport(pool string) egress.Report {
	return r.r.Report(pool, egress.ModeObserve)
}

func startAgentWith(t *testing.T, b *joinBundle, src ReadinessSource) *Agent {
	t.Helper()
	o := RunOptions{HeartbeatInterval: 300 * time.Millisecond}
	if src != nil {
		o.Egress = src
	}
	return startJoinedAgent(t, b, o)
}

func TestEgressReadinessReport(t *testing.T) {
	t.Parallel()
	// The report is for a pool in observe mode (the default is enforce).
	b := setupJoinWith(t, func(c *config.Config) { c.Worker.ContainerSecurity.Egress.Mode = "observe" })
	busy := egress.NewReadiness(time.Hour, nil)
	busy.AddCount("default", "task-a", "metadata", 3)
	busy.AddCount("default", "task-b", "private", 2)
	busy.AddSample("default", "task-a", "metadata", "169.254.169.254:80")
	quiet := egress.NewReadiness(time.Hour, nil)
	startAgentWith(t, b, readiness{busy})
	startAgentWith(t, b, readiness{quiet})
	silent := startAgentWith(t, b, nil)

	sec := v1.NewSecurityServiceClient(b.in.Conn)
	var rep *v1.ReadinessReport
	controlplanetest.Eventually(t, 10*time.Second, "two machines reporting", func() bool {
		resp, err := sec.GetReadinessReport(b.ctx, &v1.GetReadinessReportRequest{Pool: "default"})
		if err != nil {
			return false
		}
		rep = resp.Report
		return rep.MachinesReporting == 2
	})
	if rep.Total != 5 || rep.SafeToEnforce || rep.Mode != "observe" {
		t.Errorf("report = %+v", rep)
	}
	if len(rep.ByClass) != 2 || rep.ByClass[0].Class != "metadata" || rep.ByClass[0].Count != 3 {
		t.Errorf("by class = %v", rep.ByClass)
	}
	if len(rep.Destinations) != 1 || rep.Destinations[0].Destination != "169.254.169.254:80" {
		t.Errorf("destinations = %v", rep.Destinations)
	}
	if len(rep.MachinesSilent) != 1 || rep.MachinesSilent[0] != silent.MachineID() {
		t.Errorf("silent = %v, want [%s]", rep.MachinesSilent, silent.MachineID())
	}

	// The CLI shows the same.
	md, _ := metadata.FromOutgoingContext(b.ctx)
	token := strings.TrimPrefix(md.Get("authorization")[0], "Bearer ")
	var out, errOut bytes.Buffer
	env := map[string]string{"LEVERS9_CONTROLPLANE": b.in.Server.GRPCAddr(), "LEVERS9_TOKEN": token,
		"LEVERS9_CONTROLPLANE_TLS": "true", "LEVERS9_CONTROLPLANE_CA": b.caFile, "LEVERS9_HOME": t.TempDir()}
	code := cli.Main([]string{"security", "report", "--pool", "default"}, cli.IO{In: strings.NewReader(""), Out: &out, Err: &errOut},
		func(k string) string { return env[k] })
	if code != 0 || !strings.Contains(out.String(), "safe to enforce: no") || !strings.Contains(out.String(), "169.254.169.254:80") {
		t.Errorf("security report: %d %s %s", code, out.String(), errOut.String())
	}
	_, err := sec.GetReadinessReport(b.ctx, &v1.GetReadinessReportRequest{Pool: "nope"})
	if err == nil {
		t.Error("unknown pool accepted")
	}
}
