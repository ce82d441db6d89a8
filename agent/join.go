package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/enroll"
)

// JoinOptions say how to enroll.
type JoinOptions struct {
	// Controlplane is the controlplane's gRPC HOST:PORT.
	Controlplane string
	// CAFile is the CA of the controlplane's certificate; empty trusts the
	// system roots.
	CAFile string
	// TokenFile holds the join token; it is deleted after a successful join.
	TokenFile string
	State     State
	Version   string
	Hostname  string
}

// Join enrolls this machine: it makes a key pair, sends a CSR with the join
// token, and saves the certificate. A machine that already joined is left
// alone (the join script may run twice).
func Join(ctx context.Context, o JoinOptions) (Settings, error) {
	if o.State.Joined("") {
		st, err := o.State.Settings()
		if err == nil {
			return st, nil
		}
	}
	raw, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return Settings{}, fmt.Errorf("read the join token: %w", err)
	}
	token := strings.TrimSpace(string(raw))
	clear(raw)
	if _, err := enroll.ParseJoinToken(token); err != nil {
		return Settings{}, fmt.Errorf("%s: %w", o.TokenFile, err)
	}
	cpCA, creds, err := controlplaneCreds(o.CAFile)
	if err != nil {
		return Settings{}, err
	}
	keyPEM, csrPEM, err := enroll.NewKeyAndCSR(o.Hostname)
	if err != nil {
		return Settings{}, fmt.Errorf("make the agent key: %w", err)
	}
	conn, err := grpc.NewClient(o.Controlplane, grpc.WithTransportCredentials(creds))
	if err != nil {
		return Settings{}, fmt.Errorf("connect to %s: %w", o.Controlplane, err)
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := v1.NewEnrollServiceClient(conn).Enroll(cctx, &v1.EnrollRequest{
		JoinToken: token, CsrPem: string(csrPEM), AgentVersion: o.Version, Hostname: o.Hostname})
	if err != nil {
		if st, ok := status.FromError(err); ok {
			return Settings{}, fmt.Errorf("the controlplane refused to enroll this machine: %s", st.Message())
		}
		return Settings{}, fmt.Errorf("enroll with %s: %w", o.Controlplane, err)
	}
	if _, err := tls.X509KeyPair([]byte(resp.CertificatePem), keyPEM); err != nil {
		return Settings{}, fmt.Errorf("the controlplane returned a certificate for another key: %w", err)
	}
	st := Settings{MachineID: resp.MachineId, Pool: resp.Pool, Controlplane: o.Controlplane, TunnelAddrs: resp.TunnelAddrs,
		ControlplaneCA: len(cpCA) > 0, Labels: resp.Labels}
	if err := o.State.save(st, keyPEM, []byte(resp.CertificatePem), []byte(resp.CaPem), cpCA); err != nil {
		return Settings{}, fmt.Errorf("save the credential in %s: %w", o.State.Dir, err)
	}
	if err := os.Remove(o.TokenFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("joined, but could not delete the used token %s: %w", o.TokenFile, err)
	}
	return st, nil
}

// controlplaneCreds builds TLS credentials trusting caFile (or the system).
func controlplaneCreds(caFile string) ([]byte, credentials.TransportCredentials, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	var caPEM []byte
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, nil, fmt.Errorf("read the controlplane CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, nil, fmt.Errorf("%s holds no PEM certificate", caFile)
		}
		cfg.RootCAs, caPEM = pool, b
	}
	return caPEM, credentials.NewTLS(cfg), nil
}
