package tasks_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/tunnel"
)

// scriptedAgent is a machine at the tunnel boundary: it enrolls through the
// real API, holds a real tunnel, heartbeats with an inventory and serves the
// Agent service, but instead of containers it plays each task's command:
// "echo A B" prints one line per word, "exit N" ends with N, "sleep"
// runs until cancelled. The real agent is tested in agent/ and test/e2e.
type scriptedAgent struct {
	t         *testing.T
	machineID string
	cpus      int32
	gpus      int
	auto      *tunnel.Auto

	mu      sync.Mutex
	cp      agentv1.ControlplaneClient
	held    map[string]context.CancelFunc
	ran     []string // task/attempt in start order
	running int
	peak    int
	stopped bool
}

func startScriptedAgent(t *testing.T, in *controlplanetest.Instance, ctx context.Context, pool string, cpus int32, gpus int) *scriptedAgent {
	t.Helper()
	created, err := v1.NewMachineServiceClient(in.Conn).CreateMachine(ctx, &v1.CreateMachineRequest{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, csrPEM, err := enroll.NewKeyAndCSR("scripted")
	if err != nil {
		t.Fatal(err)
	}
	en, err := v1.NewEnrollServiceClient(in.Conn).Enroll(context.Background(), &v1.EnrollRequest{JoinToken: created.JoinToken, CsrPem: string(csrPEM), AgentVersion: "scripted"})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair([]byte(en.CertificatePem), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool509 := x509.NewCertPool()
	pool509.AppendCertsFromPEM([]byte(en.CaPem))
	a := &scriptedAgent{t: t, machineID: en.MachineId, cpus: cpus, gpus: gpus, held: map[string]context.CancelFunc{}}
	a.auto, err = tunnel.NewAuto(tunnel.ClientConfig{Addrs: []string{in.Server.Agents().Addr().String()},
		TLS:         &tls.Config{RootCAs: pool509, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"},
		BackoffBase: 50 * time.Millisecond, BackoffMax: 300 * time.Millisecond}, a.onSession)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.auto.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.stop)
	return a
}

func (a *scriptedAgent) stop() {
	a.auto.Stop()
	a.mu.Lock()
	a.stopped = true
	for _, c := range a.held {
		c()
	}
	a.mu.Unlock()
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
	inv := &v1.Inventory{Hostname: "scripted", Cpus: a.cpus, MemoryBytes: 8 << 30}
	for i := 0; i < a.gpus; i++ {
		inv.Gpus = append(inv.Gpus, &v1.Gpu{Index: int32(i), Uuid: fmt.Sprintf("GPU-%s-%d", a.machineID, i), Name: "NVIDIA L40S"})
	}
	for {
		req := &agentv1.HeartbeatRequest{AgentVersion: "scripted", Inventory: inv, SentAt: timestamppb.Now()}
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
				a.cancel(r.TaskId, int(r.Attempt))
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

func (a *scriptedAgent) cancel(id string, n int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.held[fmt.Sprintf("%s/%d", id, n)]
	if ok {
		c()
	}
	return ok
}

func (a *scriptedAgent) started() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.ran...)
}

func (a *scriptedAgent) peakRunning() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peak
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
	if _, ok := a.held[key]; ok {
		a.mu.Unlock()
		return &agentv1.RunTaskResponse{AlreadyRunning: true}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.held[key] = cancel
	a.ran = append(a.ran, key)
	a.running++
	a.peak = max(a.peak, a.running)
	a.mu.Unlock()
	go a.play(ctx, ta, key)
	return &agentv1.RunTaskResponse{}, nil
}

// play reports RUNNING, the command's lines and its end, resending until
// each report is acknowledged (as the real agent does).
func (a *scriptedAgent) play(ctx context.Context, ta *agentv1.TaskAttempt, key string) {
	var recs []*agentv1.AttemptRecord
	upd := func(st v1.AttemptState, code int32) {
		recs = append(recs, &agentv1.AttemptRecord{Time: timestamppb.Now(), Record: &agentv1.AttemptRecord_Update{Update: &agentv1.AttemptUpdate{State: st, ExitCode: code}}})
	}
	line := func(s string) {
		recs = append(recs, &agentv1.AttemptRecord{Time: timestamppb.Now(), Record: &agentv1.AttemptRecord_Log{Log: &v1.LogLine{Stream: v1.LogStream_LOG_STREAM_STDOUT, Text: s}}})
	}
	upd(v1.AttemptState_ATTEMPT_STATE_RUNNING, 0)
	var code int32
	end := v1.AttemptState_ATTEMPT_STATE_SUCCEEDED
	cmd := ta.Command
	if len(cmd) > 0 {
		switch cmd[0] {
		case "echo":
			for _, w := range cmd[1:] {
				line(w)
			}
		case "exit":
			n, _ := strconv.Atoi(cmd[1])
			code = int32(n)
			end = v1.AttemptState_ATTEMPT_STATE_FAILED
		case "sleep":
			a.send(ta, recs, 1)
			first := uint64(len(recs)) + 1
			recs = nil
			d := time.Hour
			if len(cmd) > 1 {
				d, _ = time.ParseDuration(cmd[1])
			}
			select {
			case <-ctx.Done():
				upd(v1.AttemptState_ATTEMPT_STATE_CANCELLED, 137)
			case <-time.After(d):
				upd(end, 0)
			}
			a.finish(ta, recs, first, key)
			return
		}
	}
	upd(end, code)
	a.finish(ta, recs, 1, key)
}

func (a *scriptedAgent) finish(ta *agentv1.TaskAttempt, recs []*agentv1.AttemptRecord, first uint64, key string) {
	a.send(ta, recs, first)
	a.mu.Lock()
	delete(a.held, key)
	a.running--
	a.mu.Unlock()
}

func (a *scriptedAgent) send(ta *agentv1.TaskAttempt, recs []*agentv1.AttemptRecord, first uint64) {
	for i := 0; i < 200; i++ {
		a.mu.Lock()
		cp, stopped := a.cp, a.stopped
		a.mu.Unlock()
		if stopped {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := cp.ReportAttempt(ctx, &agentv1.ReportAttemptRequest{TaskId: ta.TaskId, Attempt: ta.Attempt, FirstSeq: first, Records: recs})
		cancel()
		if err == nil && resp.AckedSeq >= first+uint64(len(recs))-1 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.stopped {
		a.t.Errorf("report of %s/%d never acknowledged", ta.TaskId, ta.Attempt)
	}
}
