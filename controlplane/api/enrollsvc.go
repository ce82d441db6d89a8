package api

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/peer"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
)

// EnrollMethod is Enroll's full method name; the join token is its only
// credential.
const EnrollMethod = "/levers9.v1.EnrollService/Enroll"

// CAProvider returns the agent CA once the store is ready.
type CAProvider func() (*enroll.CA, error)

// EnrollService implements levers9.v1.EnrollService.
type EnrollService struct {
	v1.UnimplementedEnrollServiceServer
	*Deps
}

// Enroll signs the agent's CSR after consuming its join token.
func (s *EnrollService) Enroll(ctx context.Context, req *v1.EnrollRequest) (*v1.EnrollResponse, error) {
	resp, err := s.enroll(ctx, req)
	if err != nil {
		who := ""
		if p, ok := peer.FromContext(ctx); ok {
			who = p.Addr.String()
		}
		s.Metrics.RefusedJoin()
		s.Log.Warn("enrollment refused", "audit", true, "peer", who, "reason", err.Error())
	}
	return resp, errdefs.ToGRPC(err)
}

func (s *EnrollService) enroll(ctx context.Context, req *v1.EnrollRequest) (*v1.EnrollResponse, error) {
	jt, err := enroll.ParseJoinToken(req.GetJoinToken())
	if err != nil {
		return nil, err
	}
	csr, err := enroll.ParseCSR([]byte(req.GetCsrPem()))
	if err != nil {
		return nil, err
	}
	ca, err := s.CA()
	if err != nil {
		return nil, err
	}
	if len(req.GetAgentVersion()) > 64 || len(req.GetHostname()) > 255 {
		return nil, fmt.Errorf("agent_version or hostname too long: %w", errdefs.ErrInvalidArgument)
	}
	var certPEM []byte
	m, err := s.Store.Enroll(ctx, jt.ID, s.now(), jt.Matches, func(m store.Machine) (store.Enrollment, error) {
		pool, ok := s.Config.Worker.Pools[m.Pool]
		if !ok {
			return store.Enrollment{}, fmt.Errorf("pool %q of machine %s no longer exists: %w", m.Pool, m.ID, store.ErrJoinRefused)
		}
		if missing := config.Unselected(pool.NodeSelector, m.Labels); len(missing) > 0 {
			// The token is not consumed: the operator can change the
			// pool's nodeSelector and the same script joins.
			return store.Enrollment{}, fmt.Errorf("pool %q selects machines by worker.pools.%s.nodeSelector, and machine %s lacks the label %s: create the machine with `levers9 machine create --pool %s --label %s` (or change the pool's nodeSelector): %w",
				m.Pool, m.Pool, m.ID, strings.Join(missing, ", "), m.Pool, strings.Join(missing, " --label "), store.ErrJoinRefused)
		}
		pemBytes, notAfter, err := ca.Sign(csr, m.ID, s.Config.Controlplane.CertTTL())
		if err != nil {
			return store.Enrollment{}, err
		}
		certPEM = pemBytes
		serial, err := enroll.SerialOf(pemBytes)
		if err != nil {
			return store.Enrollment{}, err
		}
		return store.Enrollment{Serial: serial, NotAfter: notAfter, AgentVersion: req.GetAgentVersion(), Hostname: req.GetHostname()}, nil
	})
	if err != nil {
		return nil, err
	}
	s.Metrics.Enrolled()
	s.Log.Info("machine enrolled", "audit", true, "workspace_id", m.WorkspaceID, "machine_id", m.ID, "pool", m.Pool, "hostname", m.Hostname)
	s.publish(ctx, bus.Event{Workspace: m.WorkspaceID, Kind: "machine.enrolled", Object: m.ID})
	return &v1.EnrollResponse{MachineId: m.ID, Pool: m.Pool, CertificatePem: string(certPEM), CaPem: string(ca.CertPEM()),
		ExpiresAt: ts(m.CertNotAfter), TunnelAddrs: []string{s.Public.Tunnel}, Labels: m.Labels}, nil
}
