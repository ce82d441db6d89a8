package agents

import (
	"context"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/tunnel"
)

// Certificate pinning after admission. A machine's sessions must keep
// presenting its current certificate (machines.cert_serial):
//
//	renewal ──► cert_serial = new, prev_cert_serial = the renewing session's
//	  │         (that session and reconnects on the old certificate still admitted)
//	  ▼
//	first session on the new certificate ──► prev_cert_serial = NULL
//	                                          (the old certificate is refused)
//
// Every ReauthorizeInterval the replica checks each session it holds
// against Postgres and closes those whose machine is gone or deleted or
// whose certificate is neither current nor previous. A session still on the
// previous certificate at two checks in a row is closed too: its agent has
// had a full interval to install the new certificate and now reconnects
// with it, which retires the old one. An agent that reconnects on the
// previous certificate never got the new one, so its next heartbeat asks it
// to renew again (needsRenewal).

// reauthorizeLoop re-authorizes the local sessions every
// ReauthorizeInterval until ctx ends.
func (r *Registry) reauthorizeLoop(ctx context.Context) {
	t := r.cfg.Clock.NewTicker(r.cfg.ReauthorizeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			r.reauthorize(ctx)
		}
	}
}

// reauthorize checks every local session once (one query) and closes those
// that no longer qualify. When Postgres does not answer nothing is closed.
func (r *Registry) reauthorize(ctx context.Context) {
	held := r.hub.Agents()
	if len(held) == 0 {
		return
	}
	ids := make([]string, len(held))
	for i, a := range held {
		ids[i] = a.Identity
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.ReauthorizeInterval)
	certs, err := r.cfg.Store.MachineCerts(qctx, ids)
	cancel()
	if err != nil {
		if !errdefs.IsCanceled(err) {
			r.cfg.Log.Warn("re-authorizing tunnels: machines not read; sessions kept", "sessions", len(held), "err", err)
		}
		return
	}
	r.mu.Lock()
	wasOnPrev := r.onPrev
	r.onPrev = map[*tunnel.Agent]bool{}
	r.mu.Unlock()
	for _, a := range held {
		c, known := certs[a.Identity]
		serial := serialOf(a.Session.PeerCertificate())
		var reason string
		switch {
		case !known:
			reason = "unknown"
		case c.Deleted:
			reason = "deleted"
		case serial == c.CertSerial:
			continue
		case serial != "" && serial == c.PrevCertSerial:
			if !wasOnPrev[a] {
				r.mu.Lock()
				r.onPrev[a] = true
				r.mu.Unlock()
				continue
			}
			reason = "renewed"
		default:
			reason = "not_current"
		}
		r.metrics.reauthClosed.WithLabelValues(reason).Inc()
		if reason == "renewed" {
			r.cfg.Log.Info("tunnel closed so the agent reconnects with its renewed certificate",
				"machine_id", a.Identity, "serial", serial, "current_serial", c.CertSerial)
		} else {
			r.cfg.Log.Warn("tunnel closed on re-authorization", "machine_id", a.Identity, "reason", reason,
				"serial", serial, "current_serial", c.CertSerial, "audit", true)
		}
		_ = a.Session.Close()
	}
}

// presentedSerial is the serial of the certificate machineID's local
// session presented ("" when this replica holds none).
func (r *Registry) presentedSerial(machineID string) string {
	a, ok := r.local(machineID)
	if !ok {
		return ""
	}
	return serialOf(a.Session.PeerCertificate())
}

// needsRenewal reports whether machineID's local session was admitted on
// its previous certificate: the agent reconnected without the new one.
func (r *Registry) needsRenewal(machineID string) bool {
	a, ok := r.local(machineID)
	if !ok {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stale[machineID] == a
}

// renewed forgets that machineID must renew.
func (r *Registry) renewed(machineID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.stale, machineID)
}
