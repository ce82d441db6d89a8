package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/tunnel"
)

// TestOldCertificateRefusedAfterRenewal is the attack on a copied agent
// key: the attacker keeps the agent's key and certificate, the real agent
// renews and reconnects with its new certificate, and the copy, although
// still signed by the agent CA and not expired, gets no tunnel.
func TestOldCertificateRefusedAfterRenewal(t *testing.T) {
	t.Parallel()
	b := setupJoin(t)
	a := joinedAgent(t, b)
	id := a.MachineID()
	controlplanetest.Eventually(t, 10*time.Second, "online", func() bool {
		_, online := b.in.Server.Agents().Online(id)
		return online
	})
	oldCrt, _ := os.ReadFile(a.o.State.path("agent.crt"))
	oldKey, _ := os.ReadFile(a.o.State.path("agent.key"))
	stolen, err := tls.X509KeyPair(oldCrt, oldKey)
	if err != nil {
		t.Fatal(err)
	}

	// The real agent renews...
	controlplanetest.Exec(t, b.in, `UPDATE machines SET cert_not_after = now() + interval '1 minute' WHERE id = $1`, id)
	controlplanetest.Eventually(t, 10*time.Second, "certificate renewed on disk", func() bool {
		now, _ := os.ReadFile(a.o.State.path("agent.crt"))
		return len(now) > 0 && !bytes.Equal(now, oldCrt)
	})
	// ...and reconnects with its new certificate.
	connected := func() int { return len(b.in.Logs.Find("agent connected")) }
	before := connected()
	b.in.Server.Agents().Drop(id)
	controlplanetest.Eventually(t, 10*time.Second, "reconnected with the new certificate", func() bool { return connected() > before })

	// The attacker dials with the copy.
	caPEM, _ := os.ReadFile(a.o.State.path("agent-ca.pem"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	d, err := tunnel.NewDirect(tunnel.ClientConfig{Addrs: []string{b.in.Server.Agents().Addr().String()},
		TLS: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{stolen}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := d.Dial(ctx, tunnel.DialRace)
	if err == nil {
		_ = s.Close()
		t.Fatal("a copy of the agent's old key and certificate got a tunnel after the agent renewed")
	}
	var refused *tunnel.RefusedError
	if !errors.As(err, &refused) || !refused.Permanent {
		t.Fatalf("dial with the old certificate: %v, want a permanent refusal", err)
	}
	recs := b.in.Logs.Find("tunnel refused: certificate not current")
	if len(recs) == 0 || recs[0]["machine_id"] != id || recs[0]["serial"] == "" || recs[0]["current_serial"] == "" {
		t.Errorf("refusal not logged with machine_id and serials: %v", recs)
	}
	if bytes.Contains([]byte(b.in.Logs.String()), oldKey) {
		t.Error("key material in the logs")
	}
	// The real agent is unaffected.
	controlplanetest.Eventually(t, 10*time.Second, "the real agent online", func() bool {
		_, online := b.in.Server.Agents().Online(id)
		return online
	})
}
