package agents_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/controlplane/agents"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/enroll"
)

const reauth = 300 * time.Millisecond

// TestDeletedMachineClosedWithoutDrop: the machine is deleted in Postgres
// and no drop message reaches the replica holding its tunnel (none is
// sent); the holder closes the tunnel at its next re-authorization, and
// the agent gets no other.
func TestDeletedMachineClosedWithoutDrop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r1, logs := b.replica(t, func(c *agents.Config) { c.ReauthorizeInterval = reauth })
	r2, _ := b.replica(t, func(c *agents.Config) { c.ReauthorizeInterval = reauth })
	id, cert := b.machine(t, time.Hour)
	connect(t, b, r1, id, cert)
	controlplanetest.Eventually(t, within, "online through replica 2", func() bool {
		_, online := r2.Online(id)
		return online
	})
	if _, err := b.st.DeleteMachine(context.Background(), b.ws.ID, id); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	controlplanetest.Eventually(t, within, "tunnel closed", func() bool {
		_, online := r2.Online(id)
		return !online
	})
	if took := time.Since(deleted); took > 2*reauth+time.Second {
		t.Errorf("the deleted machine's tunnel closed after %v, want within about one re-authorization (%v)", took, reauth)
	}
	recs := logs.Find("tunnel closed on re-authorization")
	if len(recs) == 0 || recs[0]["machine_id"] != id || recs[0]["reason"] != "deleted" {
		t.Errorf("closing not logged with machine_id and reason: %v", recs)
	}
	controlplanetest.Eventually(t, within, "its reconnects refused", func() bool { return len(logs.Find("tunnel refused: machine deleted")) >= 1 })
	if _, online := r1.Online(id); online {
		t.Error("the deleted machine is back online")
	}
}

// TestRenewalSwitchesCertificates walks a renewal through the tunnel: the
// renewing session keeps working, is closed once its agent has had time to
// install the new certificate, a reconnect on the old one is asked to renew
// again, and once a session presents the new certificate the old one is
// closed and refused.
func TestRenewalSwitchesCertificates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	r, logs := b.replica(t, func(c *agents.Config) { c.ReauthorizeInterval = reauth; c.Registerer = reg })
	id, oldCert := b.machine(t, time.Hour)
	old := connect(t, b, r, id, oldCert)
	controlplanetest.Eventually(t, within, "online", func() bool { return old.controlplane() != nil })
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()

	keyPEM, csrPEM, err := enroll.NewKeyAndCSR("box")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := old.controlplane().RenewCertificate(ctx, &agentv1.RenewCertificateRequest{CsrPem: string(csrPEM)})
	if err != nil {
		t.Fatal(err)
	}
	newCert, err := tls.X509KeyPair([]byte(resp.CertificatePem), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := b.st.MachineByID(ctx, id)
	if oldSerial := serial(t, oldCert); m.PrevCertSerial != oldSerial || m.CertSerial == oldSerial {
		t.Fatalf("after renewal: current %s, previous %s; want the old %s previous", m.CertSerial, m.PrevCertSerial, oldSerial)
	}

	// This agent never installs the new certificate: its session is closed
	// after a full interval on the old one, and back on the old one it is
	// asked to renew again.
	controlplanetest.Eventually(t, within, "the session on the old certificate closed", func() bool { return old.sessionCount() >= 2 })
	if len(logs.Find("reconnects with its renewed certificate")) == 0 {
		t.Error("the switch was not logged")
	}
	controlplanetest.Eventually(t, within, "a reconnect on the old certificate asked to renew", func() bool {
		hb, err := old.controlplane().Heartbeat(ctx, &agentv1.HeartbeatRequest{})
		return err == nil && hb.RenewCertificate
	})

	// The agent holding the new certificate connects: the old one is
	// retired, its session closed and its reconnects refused.
	fresh := connect(t, b, r, id, newCert)
	controlplanetest.Eventually(t, within, "old certificate refused", func() bool {
		return fresh.controlplane() != nil && len(logs.Find("tunnel refused: certificate not current")) > 0
	})
	if m, _ := b.st.MachineByID(ctx, id); m.PrevCertSerial != "" {
		t.Errorf("previous certificate %s still admitted after the switch", m.PrevCertSerial)
	}
	old.auto.Stop()
	for name, want := range map[string]string{
		"controlplane_agent_tunnels_refused_total": "not_current",
		"controlplane_agent_tunnels_closed_total":  "renewed",
	} {
		if n := counter(t, reg, name, want); n < 1 {
			t.Errorf("%s{reason=%q} = %v, want at least 1", name, want, n)
		}
	}
	if _, online := r.Online(id); !online {
		t.Error("the agent on the new certificate is not online")
	}
}

// counter reads the counter name{reason} from reg.
func counter(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func serial(t *testing.T, c tls.Certificate) string {
	t.Helper()
	x, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return x.SerialNumber.Text(16)
}
