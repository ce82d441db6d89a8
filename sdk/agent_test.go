package sdk

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/tunnel"
)

var env *controlplanetest.Env

func TestMain(m *testing.M) { os.Exit(controlplanetest.Main(m, &env)) }

// realBundle is a real controlplane (private Postgres and Redis), reached
// by the client through a relay the test can cut or repoint, with an admin
// token.
type realBundle struct {
	cfg   *config.Config
	in    *controlplanetest.Instance
	relay *relay
	token string
	admin context.Context
}

// startReal starts a controlplane that gives up on a silent machine after
// grace.
func startReal(t *testing.T, grace string) *realBundle {
	t.Helper()
	cfg := env.Config(t)
	cfg.Controlplane.LostAgentGrace = grace
	cfg.Worker.DefaultImage = "busybox:sdktest"
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "levers9-agent-linux-amd64"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.Controlplane.AgentBinariesDir = dir
	in := controlplanetest.Start(t, cfg, true)
	resp, err := v1.NewAuthServiceClient(in.Conn).Authorize(metadata.AppendToOutgoingContext(context.Background(), "x-levers9-bootstrap-secret", "test-bootstrap-secret"), &v1.AuthorizeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	controlplanetest.Eventually(t, 10*time.Second, "tunnel endpoint", func() bool { return in.Server.Agents() != nil })
	r := startRelay(t, in.Server.GRPCAddr())
	return &realBundle{cfg: cfg, in: in, relay: r, token: resp.Token,
		admin: metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+resp.Token)}
}

// client is an SDK client configured through the environment, as a
// program run next to the CLI would be.
func (b *realBundle) client(t *testing.T, opts ...Option) *Client {
	t.Helper()
	env := map[string]string{"LEVERS9_CONTROLPLANE": b.relay.addr, "LEVERS9_TOKEN": b.token, "LEVERS9_HOME": t.TempDir()}
	c, err := NewClient(context.Background(), append([]Option{WithGetenv(func(k string) string { return env[k] }), withBackoffForTest(20 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// restart stops the controlplane and starts another on the same database,
// Redis and tunnel port; the relay points at it.
func (b *realBundle) restart(t *testing.T) {
	t.Helper()
	b.in.Server.Stop()
	b.in = controlplanetest.Start(t, b.cfg, true)
	controlplanetest.Eventually(t, 10*time.Second, "tunnel endpoint", func() bool { return b.in.Server.Agents() != nil })
	b.relay.setTarget(b.in.Server.GRPCAddr())
}

// relay forwards TCP to the controlplane; cut drops every connection, as
// a network blip or a controlplane crash does.
type relay struct {
	addr string
	// mu guards target and conns.
	mu     sync.Mutex
	target string
	conns  map[net.Conn]bool
}

func startRelay(t *testing.T, target string) *relay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: ln.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); r.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			target := r.target
			r.mu.Unlock()
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns[c], r.conns[up] = true, true
			r.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	return r
}

func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
}

func (r *relay) setTarget(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.target = addr
}

// scriptedAgent is a machine at the tunnel boundary: it enrolls through the
// real API, holds a real tunnel, heartbeats and serves the Agent service,
// but plays each task's command instead of starting a container (no agent
// runs containers in these tests; agent/ and test/e2e test the real one):
//
//	echo A B       one stdout line per word
//	count N D      N lines "line-I", one every D
//	exit N         ends with exit code N
//	sleep D        runs D (default: until cancelled), then succeeds
type scriptedAgent struct {
	t         *testing.T
	machineID string
	cpus      int32
	auto      *tunnel.Auto

	// mu guards everything below.
	mu      sync.Mutex
	cp      agentv1.ControlplaneClient
	held    map[string]context.CancelFunc
	running int
	peak    int
	stopped bool
}

func (b *realBundle) startAgent(t *testing.T, cpus int32) *scriptedAgent {
	t.Helper()
	ctx := b.admin
	created, err := v1.NewMachineServiceClient(b.in.Conn).CreateMachine(ctx, &v1.CreateMachineRequest{Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, csrPEM, err := enroll.NewKeyAndCSR("sdktest")
	if err != nil {
		t.Fatal(err)
	}
	en, err := v1.NewEnrollServiceClient(b.in.Conn).Enroll(context.Background(), &v1.EnrollRequest{JoinToken: created.JoinToken, CsrPem: string(csrPEM), AgentVersion: "sdktest"})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair([]byte(en.CertificatePem), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(en.CaPem))
	a := &scriptedAgent{t: t, machineID: en.MachineId, cpus: cpus, held: map[string]context.CancelFunc{}}
	a.auto, err = tunnel.NewAuto(tunnel.ClientConfig{Addrs: []string{b.cfg.Controlplane.TunnelAddr},
		TLS:         &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"},
		BackoffBase: 50 * time.Millisecond, BackoffMax: 300 * time.Millisecond}, a.onSession)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.auto.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.stop)
	// Placement needs the inventory of a first heartbeat.
	controlplanetest.Eventually(t, 10*time.Second, "machine online", func() bool {
		m, err := v1.NewMachineServiceClient(b.in.Conn).GetMachine(ctx, &v1.GetMachineRequest{Id: a.machineID})
		return err == nil && m.Machine.GetInventory().GetCpus() > 0 && m.Machine.State == v1.MachineState_MACHINE_STATE_ONLINE
	})
	return a
}

func (a *scriptedAgent) stop() {
	a.auto.Stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopped = true
	for _, c := range a.held {
		c()
	}
}

func (a *scriptedAgent) peakRunning() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peak
}

func (a *scriptedAgent) onSession(ctx context.Context, s tunnel.Session) {
	srv := grpc.NewServer(tunnel.ServerOptions(tunnel.Limits{})...)
	agentv1.RegisterAgentServer(srv, &scriptedService{a: a})
	go tunnel.ServeGRPC(ctx, s, srv)
	defer srv.Stop()
	conn, err := tunnel.NewClientConn("controlplane", s.OpenStream, tunnel.Limits{})
	if err != nil {
		return
	}
	defer conn.Close()
	cp := agentv1.NewControlplaneClient(conn)
	a.mu.Lock()
	a.cp = cp
	a.mu.Unlock()
	inv := &v1.Inventory{Hostname: "sdktest", Cpus: a.cpus, MemoryBytes: 8 << 30}
	for {
		req := &agentv1.HeartbeatRequest{AgentVersion: "sdktest", Inventory: inv, SentAt: timestamppb.Now()}
		a.mu.Lock()
		for k := range a.held {
			id, n, _ := strings.Cut(k, "/")
			num, _ := strconv.Atoi(n)
			req.Running = append(req.Running, &agentv1.RunningAttempt{TaskId: id, Attempt: int32(num)})
		}
		a.mu.Unlock()
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cp.Heartbeat(hctx, req)
		cancel()
		if err == nil {
			for _, r := range resp.Stop {
				a.mu.Lock()
				if c, ok := a.held[fmt.Sprintf("%s/%d", r.TaskId, r.Attempt)]; ok {
					c()
				}
				a.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

type scriptedService struct {
	agentv1.UnimplementedAgentServer
	a *scriptedAgent
}

func (s *scriptedService) RunTask(_ context.Context, req *agentv1.RunTaskRequest) (*agentv1.RunTaskResponse, error) {
	a := s.a
	ta := req.GetAttempt()
	key := fmt.Sprintf("%s/%d", ta.TaskId, ta.Attempt)
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.held[key]; ok {
		return &agentv1.RunTaskResponse{AlreadyRunning: true}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.held[key] = cancel
	a.running++
	a.peak = max(a.peak, a.running)
	go a.play(ctx, ta, key)
	return &agentv1.RunTaskResponse{}, nil
}

func (s *scriptedService) CancelTask(_ context.Context, req *agentv1.CancelTaskRequest) (*agentv1.CancelTaskResponse, error) {
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	c, ok := s.a.held[fmt.Sprintf("%s/%d", req.TaskId, req.Attempt)]
	if ok {
		c()
	}
	return &agentv1.CancelTaskResponse{Found: ok}, nil
}

// play reports the attempt record by record, each resent until
// acknowledged (as the real agent does).
func (a *scriptedAgent) play(ctx context.Context, ta *agentv1.TaskAttempt, key string) {
	defer func() {
		a.mu.Lock()
		delete(a.held, key)
		a.running--
		a.mu.Unlock()
	}()
	seq := uint64(0)
	send := func(r *agentv1.AttemptRecord) {
		seq++
		r.Time = timestamppb.Now()
		a.send(ta, r, seq)
	}
	update := func(st v1.AttemptState, code int32) {
		send(&agentv1.AttemptRecord{Record: &agentv1.AttemptRecord_Update{Update: &agentv1.AttemptUpdate{State: st, ExitCode: code}}})
	}
	line := func(s string) {
		send(&agentv1.AttemptRecord{Record: &agentv1.AttemptRecord_Log{Log: &v1.LogLine{Stream: v1.LogStream_LOG_STREAM_STDOUT, Text: s}}})
	}
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			update(v1.AttemptState_ATTEMPT_STATE_CANCELLED, 137)
			return false
		case <-time.After(d):
			return true
		}
	}
	update(v1.AttemptState_ATTEMPT_STATE_RUNNING, 0)
	cmd := append(ta.Command, "", "", "")
	switch cmd[0] {
	case "echo":
		for _, w := range ta.Command[1:] {
			line(w)
		}
	case "count":
		n, _ := strconv.Atoi(cmd[1])
		d, _ := time.ParseDuration(cmd[2])
		for i := range n {
			if !wait(d) {
				return
			}
			line(fmt.Sprintf("line-%d", i))
		}
	case "exit":
		n, _ := strconv.Atoi(cmd[1])
		update(v1.AttemptState_ATTEMPT_STATE_FAILED, int32(n))
		return
	case "sleep":
		d, err := time.ParseDuration(cmd[1])
		if err != nil {
			d = time.Hour
		}
		if !wait(d) {
			return
		}
	}
	update(v1.AttemptState_ATTEMPT_STATE_SUCCEEDED, 0)
}

func (a *scriptedAgent) send(ta *agentv1.TaskAttempt, r *agentv1.AttemptRecord, seq uint64) {
	for {
		a.mu.Lock()
		cp, stopped := a.cp, a.stopped
		a.mu.Unlock()
		if stopped {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := cp.ReportAttempt(ctx, &agentv1.ReportAttemptRequest{TaskId: ta.TaskId, Attempt: ta.Attempt, FirstSeq: seq, Records: []*agentv1.AttemptRecord{r}})
		cancel()
		if err == nil && resp.AckedSeq >= seq {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
