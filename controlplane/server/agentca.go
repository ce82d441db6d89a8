package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"crypto/x509"
	"encoding/pem"

	"github.com/levers9/levers9/controlplane/api"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
)

const agentCAID = "agents"

// loadAgentCA reads the agent CA, creating it on the first start.
func (s *Server) loadAgentCA(ctx context.Context) error {
	row, err := s.store.GetOrCreateCA(ctx, agentCAID, func() (store.CARow, error) {
		_, certPEM, keyPEM, err := enroll.NewCA("levers9 agents")
		if err != nil {
			return store.CARow{}, err
		}
		keyID, sealed, err := s.keyring.Seal(keyPEM, store.CAAAD(agentCAID))
		clear(keyPEM)
		if err != nil {
			return store.CARow{}, err
		}
		s.log.Info("created the agent CA")
		return store.CARow{CertPEM: string(certPEM), Key: store.Sealed{KeyID: keyID, Bytes: sealed}}, nil
	})
	if err != nil {
		return err
	}
	keyPEM, err := s.keyring.Open(row.Key.KeyID, row.Key.Bytes, store.CAAAD(agentCAID))
	if err != nil {
		return fmt.Errorf("open the agent CA key: %w", err)
	}
	defer clear(keyPEM)
	ca, err := enroll.LoadCA([]byte(row.CertPEM), keyPEM)
	if err != nil {
		return err
	}
	s.ca.Store(ca)
	return nil
}

// agentCA is the api.CAProvider.
func (s *Server) agentCA() (*enroll.CA, error) {
	if ca := s.ca.Load(); ca != nil {
		return ca, nil
	}
	if e := s.caErr.Load(); e != nil {
		return nil, fmt.Errorf("the agent CA cannot be used: %v: %w", *e, errdefs.ErrFailedPrecondition)
	}
	return nil, fmt.Errorf("the agent CA is not loaded yet (waiting for Postgres): %w", errdefs.ErrUnavailable)
}

// AgentCA returns the agent CA, for the tunnel endpoint.
func (s *Server) AgentCA() (*enroll.CA, error) { return s.agentCA() }

// publicEndpoints works out what join scripts tell machines.
func (s *Server) publicEndpoints(useTLS bool) (api.PublicEndpoints, error) {
	host := s.cfg.Controlplane.PublicHost
	port := func(addr string) string {
		_, p, _ := net.SplitHostPort(addr)
		return p
	}
	scheme := "http"
	if useTLS {
		scheme = "https"
	}
	tunnelPort := port(s.cfg.Controlplane.TunnelAddr)
	pub := api.PublicEndpoints{
		GRPC:   net.JoinHostPort(host, port(s.grpcLn.Addr().String())),
		REST:   scheme + "://" + net.JoinHostPort(host, port(s.restLn.Addr().String())),
		Tunnel: net.JoinHostPort(host, tunnelPort),
	}
	caPEM, err := s.trustPEM()
	if err != nil {
		return pub, err
	}
	pub.CAPEM = caPEM
	return pub, nil
}

// trustPEM is the CA machines should trust for this controlplane's
// certificate: tls.caFile, or the certificate itself when self-signed.
func (s *Server) trustPEM() (string, error) {
	t := s.cfg.Controlplane.TLS
	if t.CAFile != "" {
		b, err := os.ReadFile(t.CAFile)
		if err != nil {
			return "", fmt.Errorf("read controlplane.tls.caFile: %w", err)
		}
		return string(b), nil
	}
	if t.CertFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(t.CertFile)
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", errors.New("controlplane certificate is not PEM")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", err
	}
	if c.IsCA && strings.EqualFold(c.Subject.String(), c.Issuer.String()) {
		return string(pem.EncodeToMemory(blk)), nil
	}
	return "", nil
}
