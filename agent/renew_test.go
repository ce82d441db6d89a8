package agent

import (
	"bytes"
	"os"
	"testing"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// TestCertificateRenewal ages the machine's certificate in the database:
// the next heartbeat asks for a renewal, the agent sends a CSR for a new
// key, and the new certificate is installed and recorded.
func TestCertificateRenewal(t *testing.T) {
	t.Parallel()
	b := setupJoin(t)
	a := joinedAgent(t, b)
	controlplanetest.Eventually(t, 10*time.Second, "online", func() bool {
		_, online := b.in.Server.Agents().Online(a.MachineID())
		return online
	})
	before, _ := os.ReadFile(a.o.State.path("agent.crt"))
	oldKey, _ := os.ReadFile(a.o.State.path("agent.key"))
	m, err := b.machines.GetMachine(b.ctx, &v1.GetMachineRequest{Id: a.MachineID()})
	if err != nil {
		t.Fatal(err)
	}
	oldExpiry := m.Machine.CertificateExpiresAt.AsTime()
	controlplanetest.Exec(t, b.in, `UPDATE machines SET cert_not_after = now() + interval '1 minute' WHERE id = $1`, a.MachineID())
	controlplanetest.Eventually(t, 10*time.Second, "certificate renewed on disk", func() bool {
		now, _ := os.ReadFile(a.o.State.path("agent.crt"))
		return len(now) > 0 && !bytes.Equal(now, before)
	})
	newKey, _ := os.ReadFile(a.o.State.path("agent.key"))
	if bytes.Equal(oldKey, newKey) {
		t.Error("renewal kept the old key")
	}
	if fi, _ := os.Stat(a.o.State.path("agent.key")); fi.Mode().Perm() != 0o600 {
		t.Errorf("renewed key mode %v", fi.Mode().Perm())
	}
	m, err = b.machines.GetMachine(b.ctx, &v1.GetMachineRequest{Id: a.MachineID()})
	if err != nil || !m.Machine.CertificateExpiresAt.AsTime().After(oldExpiry.Add(-time.Minute)) {
		t.Fatalf("recorded expiry after renewal: %v (was %v), %v", m.GetMachine().GetCertificateExpiresAt().AsTime(), oldExpiry, err)
	}
	// The agent reconnects with the new certificate.
	if r := b.in.Server.Agents(); r != nil {
		r.Drop(a.MachineID())
	}
	controlplanetest.Eventually(t, 10*time.Second, "back online with the new certificate", func() bool {
		_, online := b.in.Server.Agents().Online(a.MachineID())
		return online
	})
}
