package agents_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/enroll"
)

// TestAgentService calls the controlplane's agent API over a real tunnel:
// the caller is the tunnel's identity, never a request field.
func TestAgentService(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.replica(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	// Certificates of 24 h: one of an hour is past two thirds of its life.
	fresh, freshCert := b.machine(t, 24*time.Hour)
	old, oldCert := b.machine(t, time.Hour)
	agents := map[string]*fakeAgent{fresh: connect(t, b, r, fresh, freshCert), old: connect(t, b, r, old, oldCert)}
	for id, a := range agents {
		controlplanetest.Eventually(t, within, "agent "+id+" connected", func() bool { return a.controlplane() != nil })
	}

	t.Run("heartbeat", func(t *testing.T) {
		for _, tc := range []struct {
			id        string
			wantRenew bool
		}{{fresh, false}, {old, true}} {
			resp, err := agents[tc.id].controlplane().Heartbeat(ctx, &agentv1.HeartbeatRequest{AgentVersion: "v9",
				Inventory: &v1.Inventory{Hostname: "h-" + tc.id, Cpus: 2}})
			if err != nil || resp.IntervalSeconds == 0 || resp.RenewCertificate != tc.wantRenew {
				t.Errorf("%s: Heartbeat = %v, %v; want renew=%v", tc.id, resp, err, tc.wantRenew)
			}
			m, err := b.st.MachineByID(ctx, tc.id)
			if err != nil || m.AgentVersion != "v9" || m.LastHeartbeat == nil || len(m.Inventory) == 0 {
				t.Errorf("%s after its heartbeat: %+v, %v", tc.id, m, err)
			}
		}
	})
	t.Run("renew certificate", func(t *testing.T) {
		_, csrPEM, err := enroll.NewKeyAndCSR("box")
		if err != nil {
			t.Fatal(err)
		}
		resp, err := agents[old].controlplane().RenewCertificate(ctx, &agentv1.RenewCertificateRequest{CsrPem: string(csrPEM)})
		if err != nil {
			t.Fatal(err)
		}
		serial, err := enroll.SerialOf([]byte(resp.CertificatePem))
		if err != nil {
			t.Fatal(err)
		}
		m, err := b.st.MachineByID(ctx, old)
		if err != nil || m.CertSerial != serial || time.Until(*m.CertNotAfter) < 23*time.Hour {
			t.Errorf("after renewal: serial %s expiring %v, want %s in 24 h (%v)", m.CertSerial, m.CertNotAfter, serial, err)
		}
		_, err = agents[old].controlplane().RenewCertificate(ctx, &agentv1.RenewCertificateRequest{CsrPem: "garbage"})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("renewal with a bad CSR: %v", err)
		}
	})
	t.Run("reports need a task manager", func(t *testing.T) {
		_, err := agents[fresh].controlplane().ReportAttempt(ctx, &agentv1.ReportAttemptRequest{TaskId: "task_x", Attempt: 1})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("ReportAttempt without Tasks: %v, want Unavailable", err)
		}
	})
}
