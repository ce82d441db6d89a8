package agents

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/tunnel"
)

// controlplaneService serves agents' calls; the caller is its tunnel
// identity, never a request field.
type controlplaneService struct {
	agentv1.UnimplementedControlplaneServer
	r *Registry
}

func caller(ctx context.Context) (*tunnel.Addr, error) {
	a, ok := tunnel.CallerFromContext(ctx)
	if !ok || a.Identity == "" {
		return nil, errdefs.ToGRPC(fmt.Errorf("not called over an agent tunnel: %w", errdefs.ErrUnauthenticated))
	}
	return a, nil
}

func (s *controlplaneService) Heartbeat(ctx context.Context, req *agentv1.HeartbeatRequest) (*agentv1.HeartbeatResponse, error) {
	a, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	id, transport := a.Identity, string(a.Transport)
	var inv []byte
	if req.GetInventory() != nil {
		if inv, err = protojson.Marshal(req.GetInventory()); err != nil {
			return nil, errdefs.ToGRPC(err)
		}
	}
	notAfter, err := s.r.cfg.Store.Heartbeat(ctx, id, transport, req.GetAgentVersion(), inv)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	if rep := req.GetEgressReport(); rep != nil {
		b, err := protojson.Marshal(rep)
		if err != nil {
			return nil, errdefs.ToGRPC(err)
		}
		if err := s.r.cfg.Bus.PutEgressReport(ctx, id, b, bus.EgressReportTTL); err != nil {
			s.r.cfg.Log.Warn("egress report not kept", "machine_id", id, "err", err)
		}
	}
	resp := &agentv1.HeartbeatResponse{IntervalSeconds: 10, MetricsIntervalSeconds: int32(s.r.cfg.WorkerMetricsInterval / time.Second),
		LeaseSeconds: uint32(s.r.cfg.LostGrace.Round(time.Second) / time.Second)}
	if t := s.r.cfg.Tasks; t != nil {
		stop, err := t.Running(ctx, id, req.GetRunning())
		if err != nil {
			return nil, errdefs.ToGRPC(err)
		}
		resp.Stop = stop
	}
	// Renew once two thirds of the certificate's life have passed, or when
	// the agent came back on its previous certificate (it never installed
	// the one it was issued).
	if notAfter != nil && notAfter.Sub(s.r.cfg.Clock.Now()) < s.r.cfg.CertTTL/3 || s.r.needsRenewal(id) {
		resp.RenewCertificate = true
	}
	return resp, nil
}

func (s *controlplaneService) RenewCertificate(ctx context.Context, req *agentv1.RenewCertificateRequest) (*agentv1.RenewCertificateResponse, error) {
	a, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	id := a.Identity
	csr, err := enroll.ParseCSR([]byte(req.GetCsrPem()))
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	certPEM, notAfter, err := s.r.cfg.CA.Sign(csr, id, s.r.cfg.CertTTL)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	serial, err := enroll.SerialOf(certPEM)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	// The certificate the caller's session presented becomes the previous
	// one, admitted until the agent reconnects with the new one; any older
	// certificate stops working now.
	presented := s.r.presentedSerial(id)
	if err := s.r.cfg.Store.RenewCertificate(ctx, id, presented, serial, notAfter); err != nil {
		if errdefs.IsPermissionDenied(err) {
			s.r.cfg.Log.Warn("certificate renewal refused: the session's certificate is not current", "machine_id", id,
				"serial", presented, "audit", true)
		}
		return nil, errdefs.ToGRPC(err)
	}
	s.r.renewed(id)
	s.r.cfg.Log.Info("agent certificate renewed", "machine_id", id, "serial", serial, "prev_serial", presented, "expires", notAfter, "audit", true)
	return &agentv1.RenewCertificateResponse{CertificatePem: string(certPEM), ExpiresAt: timestamppb.New(notAfter)}, nil
}

func (s *controlplaneService) ReportAttempt(ctx context.Context, req *agentv1.ReportAttemptRequest) (*agentv1.ReportAttemptResponse, error) {
	a, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if s.r.cfg.Tasks == nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("this controlplane takes no task reports yet: %w", errdefs.ErrUnavailable))
	}
	resp, err := s.r.cfg.Tasks.Report(ctx, a.Identity, req)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return resp, nil
}

// WorkerGone hands an attached cluster's agent's report of a worker pod
// gone to the tasks service, which checks the worker is the caller's.
func (s *controlplaneService) WorkerGone(ctx context.Context, req *agentv1.WorkerGoneRequest) (*agentv1.WorkerGoneResponse, error) {
	a, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if s.r.cfg.Tasks == nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("this controlplane takes no worker reports yet: %w", errdefs.ErrUnavailable))
	}
	if err := s.r.cfg.Tasks.WorkerGone(ctx, a.Identity, req); err != nil {
		if errdefs.IsPermissionDenied(err) {
			s.r.cfg.Log.Warn("worker report refused", "machine_id", a.Identity, "worker_machine_id", req.GetMachineId(), "err", err, "audit", true)
		}
		return nil, errdefs.ToGRPC(err)
	}
	return &agentv1.WorkerGoneResponse{}, nil
}

// ReportMetrics keeps the caller's metrics snapshot for this replica's
// metrics endpoint (workermetrics.go), labelled with the pool the
// controlplane knows for the machine.
func (s *controlplaneService) ReportMetrics(ctx context.Context, req *agentv1.MetricsReportRequest) (*agentv1.MetricsReportResponse, error) {
	a, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	pool, err := s.r.poolOf(ctx, a.Identity)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return s.r.workers.report(a.Identity, pool, req), nil
}
