package controlplanetest

import (
	"bytes"
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
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/tunnel"
)

// ScriptedMachine is a machine at the tunnel boundary: it enrolls through
// the real API, holds a real tunnel, heartbeats with an inventory and serves
// the Agent service, but plays each task's command instead of starting a
// container (agent/ and test/e2e test the real agent):
//
//	echo A B       one stdout line per word
//	count N D      N lines "line-I", one every D
//	exit N         ends with exit code N
//	sleep [D]      runs D (default: until cancelled), then succeeds
//	upper [D]      runs D (default: none), then succeeds with its input
//	               in upper case as its result (/run/levers9/io/result)
//	result N       succeeds with a result of N bytes 'r'
//	result-refused succeeds with a result the agent refused as too large
//
// Each record is sent on its own and resent until acknowledged, as the
// real agent does.
type ScriptedMachine struct {
	ID   string
	t    testing.TB
	cpus int32
	gpus int
	auto *tunnel.Auto

	// mu guards everything below.
	mu      sync.Mutex
	cp      agentv1.ControlplaneClient
	session tunnel.Session
	// dropRuns is how many RunTask calls still drop the session instead
	// of answering (DropSessionOnRun).
	dropRuns int
	held     map[string]context.CancelFunc
	started  []string // "task/attempt" in start order
	attempts []*agentv1.TaskAttempt
	running  int
	peak     int
	stopped  bool
	// cluster is set on a scripted attached cluster's agent.
	cluster *scriptedCluster
}

// StartScriptedMachine creates a machine in pool with the admin context,
// enrolls it, connects its tunnel and waits until the controlplane has its
// inventory (cpus cores, 8 GiB, gpus GPUs named "NVIDIA L40S").
func StartScriptedMachine(t testing.TB, in *Instance, admin context.Context, pool string, cpus int32, gpus int) *ScriptedMachine {
	t.Helper()
	return startScripted(t, in, admin, pool, cpus, gpus, nil, "")
}

// StartScriptedWorker enrolls a scripted machine with a join token the
// controlplane made (a worker's, from MakeWorker), as the worker pod's
// agent would.
func StartScriptedWorker(t testing.TB, in *Instance, admin context.Context, token string, cpus int32) *ScriptedMachine {
	t.Helper()
	return startScripted(t, in, admin, "", cpus, 0, nil, token)
}

// StartScriptedClusterAgent is an attached cluster's agent at the tunnel
// boundary: created by an admin as `cluster join` does, reporting one node
// of cpus cores and 8 GiB (the sum and the largest), and serving
// ClusterAgent by recording the workers it is asked for (listed as
// starting until removed) instead of making Jobs.
func StartScriptedClusterAgent(t testing.TB, in *Instance, admin context.Context, pool string, cpus int32) *ScriptedMachine {
	t.Helper()
	return startScripted(t, in, admin, pool, cpus, 0, &scriptedCluster{workers: map[string]*agentv1.MakeWorkerRequest{}}, "")
}

func startScripted(t testing.TB, in *Instance, admin context.Context, pool string, cpus int32, gpus int, cluster *scriptedCluster, token string) *ScriptedMachine {
	t.Helper()
	machines := v1.NewMachineServiceClient(in.Conn)
	if token == "" {
		created, err := machines.CreateMachine(admin, &v1.CreateMachineRequest{Pool: pool, ClusterAgent: cluster != nil})
		if err != nil {
			t.Fatal(err)
		}
		token = created.JoinToken
	}
	keyPEM, csrPEM, err := enroll.NewKeyAndCSR("scripted")
	if err != nil {
		t.Fatal(err)
	}
	en, err := v1.NewEnrollServiceClient(in.Conn).Enroll(context.Background(), &v1.EnrollRequest{JoinToken: token, CsrPem: string(csrPEM), AgentVersion: "scripted"})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair([]byte(en.CertificatePem), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(en.CaPem))
	m := &ScriptedMachine{ID: en.MachineId, t: t, cpus: cpus, gpus: gpus, held: map[string]context.CancelFunc{}, cluster: cluster}
	m.auto, err = tunnel.NewAuto(tunnel.ClientConfig{Addrs: []string{in.Config.Controlplane.TunnelAddr},
		TLS:         &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"},
		BackoffBase: 50 * time.Millisecond, BackoffMax: 300 * time.Millisecond}, m.onSession)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.auto.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	// Placement needs the inventory of a first heartbeat.
	Eventually(t, 10*time.Second, "machine online with its inventory", func() bool {
		got, err := machines.GetMachine(admin, &v1.GetMachineRequest{Id: m.ID})
		return err == nil && got.Machine.GetInventory().GetCpus() > 0 && got.Machine.State == v1.MachineState_MACHINE_STATE_ONLINE
	})
	return m
}

// Stop drops the tunnel without a word, as a reclaimed machine does; its
// attempts stop reporting.
func (m *ScriptedMachine) Stop() {
	m.auto.Stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopped = true
	for _, c := range m.held {
		c()
	}
}

// DropSessionOnRun makes the next n RunTask calls close the tunnel
// session they arrive on instead of answering, as an agent that restarts
// just as a push reaches it; the machine then redials at once.
func (m *ScriptedMachine) DropSessionOnRun(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropRuns = n
}

// Controlplane calls the controlplane on the machine's current session
// (nil before the first one).
func (m *ScriptedMachine) Controlplane() agentv1.ControlplaneClient {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cp
}

// Workers are the MakeWorker requests a scripted cluster agent holds (not
// removed yet), by Job name.
func (m *ScriptedMachine) Workers() map[string]*agentv1.MakeWorkerRequest {
	c := m.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]*agentv1.MakeWorkerRequest{}
	for k, v := range c.workers {
		out[k] = v
	}
	return out
}

// scriptedCluster records the workers it is asked to make.
type scriptedCluster struct {
	agentv1.UnimplementedClusterAgentServer
	// mu guards workers.
	mu      sync.Mutex
	workers map[string]*agentv1.MakeWorkerRequest
}

func (c *scriptedCluster) MakeWorker(_ context.Context, req *agentv1.MakeWorkerRequest) (*agentv1.MakeWorkerResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	name := "worker-" + req.GetSpec().GetMachineId()
	c.workers[name] = req
	return &agentv1.MakeWorkerResponse{Name: name}, nil
}

func (c *scriptedCluster) RemoveWorker(_ context.Context, req *agentv1.RemoveWorkerRequest) (*agentv1.RemoveWorkerResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.workers, req.GetName())
	return &agentv1.RemoveWorkerResponse{}, nil
}

func (c *scriptedCluster) ListWorkers(_ context.Context, req *agentv1.ListWorkersRequest) (*agentv1.ListWorkersResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	resp := &agentv1.ListWorkersResponse{}
	for name, w := range c.workers {
		s := w.GetSpec()
		if req.GetPool() != "" && s.GetPool() != req.GetPool() {
			continue
		}
		resp.Workers = append(resp.Workers, &agentv1.Worker{Name: name, Pool: s.GetPool(), MachineId: s.GetMachineId(), State: "starting",
			CpuMillis: s.GetCpuMillis(), MemoryBytes: s.GetMemoryBytes(), Gpus: s.GetGpus()})
	}
	return resp, nil
}

// Started lists the attempts it started ("task/attempt"), in order.
func (m *ScriptedMachine) Started() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.started...)
}

// Attempts are the attempts pushed to it that it started, as received, in
// order.
func (m *ScriptedMachine) Attempts() []*agentv1.TaskAttempt {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*agentv1.TaskAttempt(nil), m.attempts...)
}

// PeakRunning is the most attempts it ran at once.
func (m *ScriptedMachine) PeakRunning() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak
}

func (m *ScriptedMachine) onSession(ctx context.Context, s tunnel.Session) {
	conn, err := tunnel.NewClientConn("controlplane", s.OpenStream, tunnel.Limits{})
	if err != nil {
		return
	}
	defer conn.Close()
	cp := agentv1.NewControlplaneClient(conn)
	m.mu.Lock()
	m.cp = cp
	m.session = s
	m.mu.Unlock()
	// Served once reports have somewhere to go.
	srv := grpc.NewServer(tunnel.ServerOptions(tunnel.Limits{})...)
	agentv1.RegisterAgentServer(srv, &scriptedService{m: m})
	if m.cluster != nil {
		agentv1.RegisterClusterAgentServer(srv, m.cluster)
	}
	go tunnel.ServeGRPC(ctx, s, srv)
	defer srv.Stop()
	inv := &v1.Inventory{Hostname: "scripted", Cpus: m.cpus, MemoryBytes: 8 << 30}
	if m.cluster != nil {
		inv.ClusterNodes = 1
		inv.LargestNode = &v1.NodeSize{Name: "node-0", CpuMillis: int64(m.cpus) * 1000, MemoryBytes: 8 << 30}
	}
	for i := 0; i < m.gpus; i++ {
		inv.Gpus = append(inv.Gpus, &v1.Gpu{Index: int32(i), Uuid: fmt.Sprintf("GPU-%s-%d", m.ID, i), Name: "NVIDIA L40S"})
	}
	for {
		req := &agentv1.HeartbeatRequest{AgentVersion: "scripted", Inventory: inv, SentAt: timestamppb.Now()}
		m.mu.Lock()
		for k := range m.held {
			id, n, _ := strings.Cut(k, "/")
			num, _ := strconv.Atoi(n)
			req.Running = append(req.Running, &agentv1.RunningAttempt{TaskId: id, Attempt: int32(num)})
		}
		m.mu.Unlock()
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cp.Heartbeat(hctx, req)
		cancel()
		if err == nil {
			for _, r := range resp.Stop {
				m.cancel(r.TaskId, r.Attempt)
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

func (m *ScriptedMachine) cancel(taskID string, attempt int32) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.held[fmt.Sprintf("%s/%d", taskID, attempt)]
	if ok {
		c()
	}
	return ok
}

type scriptedService struct {
	agentv1.UnimplementedAgentServer
	m *ScriptedMachine
}

func (s *scriptedService) RunTask(ctx context.Context, req *agentv1.RunTaskRequest) (*agentv1.RunTaskResponse, error) {
	m := s.m
	ta := req.GetAttempt()
	key := fmt.Sprintf("%s/%d", ta.TaskId, ta.Attempt)
	m.mu.Lock()
	if m.dropRuns > 0 {
		// Gone before answering, as an agent that restarts just then: the
		// call never gets a reply, only the session's end.
		m.dropRuns--
		sess := m.session
		m.mu.Unlock()
		_ = sess.Close()
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Second):
		}
		return nil, ctx.Err()
	}
	defer m.mu.Unlock()
	if _, ok := m.held[key]; ok {
		return &agentv1.RunTaskResponse{AlreadyRunning: true}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.held[key] = cancel
	m.started = append(m.started, key)
	m.attempts = append(m.attempts, ta)
	m.running++
	m.peak = max(m.peak, m.running)
	go m.play(ctx, ta, key)
	return &agentv1.RunTaskResponse{}, nil
}

func (s *scriptedService) CancelTask(_ context.Context, req *agentv1.CancelTaskRequest) (*agentv1.CancelTaskResponse, error) {
	return &agentv1.CancelTaskResponse{Found: s.m.cancel(req.TaskId, req.Attempt)}, nil
}

// play reports the attempt record by record.
func (m *ScriptedMachine) play(ctx context.Context, ta *agentv1.TaskAttempt, key string) {
	defer func() {
		m.mu.Lock()
		delete(m.held, key)
		m.mu.Unlock()
	}()
	seq := uint64(0)
	send := func(r *agentv1.AttemptRecord) {
		seq++
		r.Time = timestamppb.Now()
		m.send(ta, r, seq)
	}
	var result *agentv1.AttemptResult
	update := func(st v1.AttemptState, code int32) {
		u := &agentv1.AttemptUpdate{State: st, ExitCode: code}
		if st != v1.AttemptState_ATTEMPT_STATE_RUNNING {
			// Like a real container: it has ended (and stopped using the
			// machine) before its end is reported.
			m.mu.Lock()
			m.running--
			m.mu.Unlock()
			u.Result = result
		}
		send(&agentv1.AttemptRecord{Record: &agentv1.AttemptRecord_Update{Update: u}})
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
	cmd := append(append([]string(nil), ta.Command...), "", "", "")
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
	case "upper":
		d, _ := time.ParseDuration(cmd[1])
		if !wait(d) {
			return
		}
		result = &agentv1.AttemptResult{Present: true, Data: bytes.ToUpper(ta.Input)}
	case "result":
		n, _ := strconv.Atoi(cmd[1])
		result = &agentv1.AttemptResult{Present: true, Data: bytes.Repeat([]byte("r"), n)}
	case "result-refused":
		result = &agentv1.AttemptResult{Error: "the result is 9437184 bytes; the limit is 8 MiB"}
	}
	update(v1.AttemptState_ATTEMPT_STATE_SUCCEEDED, 0)
}

// send resends one record until it is acknowledged or the machine stops.
func (m *ScriptedMachine) send(ta *agentv1.TaskAttempt, r *agentv1.AttemptRecord, seq uint64) {
	for {
		m.mu.Lock()
		cp, stopped := m.cp, m.stopped
		m.mu.Unlock()
		if stopped {
			return
		}
		// The agent's own bound (agent.ReportConfig.CallTimeout's default):
		// a shorter one cut an 8 MiB result short on every try under -race
		// on a loaded machine, so the record was never acknowledged.
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		resp, err := cp.ReportAttempt(ctx, &agentv1.ReportAttemptRequest{TaskId: ta.TaskId, Attempt: ta.Attempt, FirstSeq: seq, Records: []*agentv1.AttemptRecord{r}})
		cancel()
		if err == nil && resp.AckedSeq >= seq {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
