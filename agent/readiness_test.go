package agent

import (
	"bytes"
	"fmt"
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

// blindReadiness is a node's report whose counters cannot see its
// containers' traffic (egress.Node.ReadinessReport sets Blind when, say, a
// bridge an earlier agent left routes the container subnet elsewhere).
type blindReadiness struct {
	r     *egress.Readiness
	blind string
}

func (b blindReadiness) ReadinessReport(pool string) egress.Report {
	rep := b.r.Report(pool, egress.ModeObserve)
	rep.Blind, rep.SafeToEnforce = b.blind, false
	return rep
}

// TestReadinessReportWithBlindMachine: one machine that saw nothing makes
// the pool safe to enforce; a second machine whose report is blind (it saw
// nothing either, because it cannot see) turns the merged verdict into
// "unknown", naming the machine and why, in the API and in `levers9
// security report`.
func TestReadinessReportWithBlindMachine(t *testing.T) {
	t.Parallel()
	b := setupJoinWith(t, func(c *config.Config) { c.Worker.ContainerSecurity.Egress.Mode = "observe" })
	startAgentWith(t, b, readiness{egress.NewReadiness(time.Hour, nil)})
	sec := v1.NewSecurityServiceClient(b.in.Conn)
	report := func(reporting int32) *v1.ReadinessReport {
		t.Helper()
		var rep *v1.ReadinessReport
		controlplanetest.Eventually(t, 10*time.Second, fmt.Sprintf("%d machine(s) reporting", reporting), func() bool {
			resp, err := sec.GetReadinessReport(b.ctx, &v1.GetReadinessReportRequest{Pool: "default"})
			if err != nil {
				return false
			}
			rep = resp.Report
			return rep.MachinesReporting == reporting
		})
		return rep
	}
	md, _ := metadata.FromOutgoingContext(b.ctx)
	token := strings.TrimPrefix(md.Get("authorization")[0], "Bearer ")
	cliReport := func() string {
		t.Helper()
		var out, errOut bytes.Buffer
		env := map[string]string{"LEVERS9_CONTROLPLANE": b.in.Server.GRPCAddr(), "LEVERS9_TOKEN": token,
			"LEVERS9_CONTROLPLANE_TLS": "true", "LEVERS9_CONTROLPLANE_CA": b.caFile, "LEVERS9_HOME": t.TempDir()}
		if code := cli.Main([]string{"security", "report", "--pool", "default"}, cli.IO{In: strings.NewReader(""), Out: &out, Err: &errOut},
			func(k string) string { return env[k] }); code != 0 {
			t.Fatalf("security report: exit %d: %s", code, errOut.String())
		}
		return out.String()
	}

	if rep := report(1); !rep.SafeToEnforce || len(rep.MachinesBlind) != 0 {
		t.Fatalf("one quiet machine that sees: safe=%v blind=%v, want safe", rep.SafeToEnforce, rep.MachinesBlind)
	}
	if out := cliReport(); !strings.Contains(out, "safe to enforce: yes") {
		t.Errorf("one quiet machine that sees:\n%s", out)
	}

	why := "container subnet 10.209.0.0/16 is routed through l9deadbebr, not this agent's bridge l9c0ffeebr"
	blind := startAgentWith(t, b, blindReadiness{r: egress.NewReadiness(time.Hour, nil), blind: why})
	rep := report(2)
	want := blind.MachineID() + ": " + why
	if rep.SafeToEnforce || rep.Total != 0 || len(rep.MachinesBlind) != 1 || rep.MachinesBlind[0] != want {
		t.Errorf("with a blind machine: safe=%v total=%d blind=%q; want not safe, blind [%q]", rep.SafeToEnforce, rep.Total, rep.MachinesBlind, want)
	}
	out := cliReport()
	if !strings.Contains(out, "safe to enforce: unknown: 1 machine(s) cannot see their containers' traffic: "+want) || strings.Contains(out, "safe to enforce: yes") {
		t.Errorf("with a blind machine, security report:\n%s", out)
	}
	t.Logf("security report:\n%s", out)
}
