package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/enroll"
)

type machineBundle struct {
	in       *controlplanetest.Instance
	ctx      context.Context
	admin    *v1.AuthorizeResponse
	machines v1.MachineServiceClient
	enroll   v1.EnrollServiceClient
	agentSum string
}

// setupMachines starts a controlplane with a prebuilt "agent" file and
// pools default and gpu.
func setupMachines(t *testing.T, mutate func(*config.Config)) *machineBundle {
	t.Helper()
	cfg := env.Config(t)
	dir := t.TempDir()
	agent := []byte("#!/bin/sh\necho fake agent\n")
	if err := os.WriteFile(filepath.Join(dir, "levers9-agent-linux-amd64"), agent, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(agent)
	cfg.Controlplane.AgentBinariesDir = dir
	cfg.Worker.Pools["gpu"] = config.Pool{Runtime: "runsc", GPUType: "l40s"}
	if mutate != nil {
		mutate(cfg)
	}
	in := controlplanetest.Start(t, cfg, true)
	admin := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
	return &machineBundle{in: in, ctx: withToken(context.Background(), admin.Token), admin: admin,
		machines: v1.NewMachineServiceClient(in.Conn), enroll: v1.NewEnrollServiceClient(in.Conn), agentSum: hex.EncodeToString(sum[:])}
}

func (b *machineBundle) create(t *testing.T, pool string) *v1.CreateMachineResponse {
	t.Helper()
	resp, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func csr(t *testing.T) string {
	t.Helper()
	_, c, err := enroll.NewKeyAndCSR("box")
	if err != nil {
		t.Fatal(err)
	}
	return string(c)
}

func TestMachineCreateAndEnroll(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, nil)
	created := b.create(t, "default")
	m := created.Machine
	if m.State != v1.MachineState_MACHINE_STATE_PENDING || m.Pool != "default" || m.JoinExpiresAt == nil {
		t.Fatalf("created machine = %+v", m)
	}
	if d := time.Until(m.JoinExpiresAt.AsTime()); d < 59*time.Minute || d > time.Hour {
		t.Errorf("join token lives %v, want 1h by default", d)
	}
	if !strings.Contains(created.JoinScript, created.JoinToken) || !strings.Contains(created.JoinScript, b.agentSum) {
		t.Error("join script lacks the token or the agent checksum")
	}
	if strings.Contains(b.in.Logs.String(), created.JoinToken) {
		t.Error("the join token reached the logs")
	}

	resp, err := b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: created.JoinToken, CsrPem: csr(t), AgentVersion: "test", Hostname: "box-1"})
	if err != nil {
		t.Fatalf("enroll: %v", err)
	}
	if resp.MachineId != m.Id || resp.CertificatePem == "" || resp.CaPem == "" || len(resp.TunnelAddrs) != 1 {
		t.Fatalf("enroll response = %+v", resp)
	}
	got, err := b.machines.GetMachine(b.ctx, &v1.GetMachineRequest{Id: m.Id})
	if err != nil || got.Machine.State != v1.MachineState_MACHINE_STATE_OFFLINE || got.Machine.EnrolledAt == nil || got.Machine.AgentVersion != "test" {
		t.Fatalf("after enroll: %+v %v", got, err)
	}

	// The same token again is refused, with an audit line.
	_, err = b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: created.JoinToken, CsrPem: csr(t)})
	wantCode(t, "reused token", err, codes.PermissionDenied)
	if err == nil || !strings.Contains(err.Error(), "already used") {
		t.Errorf("reuse message: %v", err)
	}
	// A forged token (right id, wrong secret) and garbage are refused.
	forged := created.JoinToken[:len(created.JoinToken)-6] + "aaaaaa"
	_, err = b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: forged, CsrPem: csr(t)})
	wantCode(t, "forged token", err, codes.PermissionDenied)
	_, err = b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: "garbage", CsrPem: csr(t)})
	wantCode(t, "garbage token", err, codes.Unauthenticated)
	audits := 0
	for _, r := range b.in.Logs.Records() {
		if r["audit"] == true && r["msg"] == "enrollment refused" {
			audits++
			if strings.Contains(r["reason"].(string), created.JoinToken) {
				t.Error("audit line holds the token")
			}
		}
	}
	if audits != 3 {
		t.Errorf("%d audit lines for refused enrollments, want 3", audits)
	}

	// A bad CSR with a fresh token: refused without consuming the token.
	fresh := b.create(t, "default")
	_, err = b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: fresh.JoinToken, CsrPem: "nope"})
	wantCode(t, "bad CSR", err, codes.InvalidArgument)
	if _, err := b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: fresh.JoinToken, CsrPem: csr(t)}); err != nil {
		t.Errorf("token consumed by a bad CSR: %v", err)
	}
}

func TestEnrollRefusals(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, nil)

	t.Run("expired", func(t *testing.T) {
		created, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default", JoinTtlSeconds: 60})
		if err != nil {
			t.Fatal(err)
		}
		// Age the token in the database rather than waiting a minute.
		controlplanetest.Exec(t, b.in, `UPDATE join_tokens SET expires_at = now() - interval '1 second' WHERE machine_id = $1`, created.Machine.Id)
		_, err = b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: created.JoinToken, CsrPem: csr(t)})
		wantCode(t, "expired token", err, codes.PermissionDenied)
		if err == nil || !strings.Contains(err.Error(), "expired") {
			t.Errorf("message: %v", err)
		}
	})
	t.Run("deleted machine", func(t *testing.T) {
		created := b.create(t, "default")
		if _, err := b.machines.DeleteMachine(b.ctx, &v1.DeleteMachineRequest{Id: created.Machine.Id}); err != nil {
			t.Fatal(err)
		}
		_, err := b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: created.JoinToken, CsrPem: csr(t)})
		wantCode(t, "deleted machine", err, codes.PermissionDenied)
		_, err = b.machines.GetMachine(b.ctx, &v1.GetMachineRequest{Id: created.Machine.Id})
		wantCode(t, "get deleted", err, codes.NotFound)
	})
	t.Run("concurrent use enrolls once", func(t *testing.T) {
		created := b.create(t, "default")
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: created.JoinToken, CsrPem: csr(t)})
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		ok := 0
		for err := range errs {
			if err == nil {
				ok++
			}
		}
		if ok != 1 {
			t.Errorf("%d enrollments with one token, want 1", ok)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		_, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "nope"})
		wantCode(t, "unknown pool", err, codes.InvalidArgument)
		_, err = b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default", JoinTtlSeconds: 5})
		wantCode(t, "short ttl", err, codes.InvalidArgument)
		_, err = b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default", Name: "dup"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default", Name: "dup"})
		wantCode(t, "duplicate name", err, codes.AlreadyExists)
	})
}

func TestPoolGoneRefusesEnroll(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, nil)
	created := b.create(t, "gpu")
	b.in.Server.Stop()
	cfg := *b.in.Config
	pools := map[string]config.Pool{}
	for k, v := range cfg.Worker.Pools {
		if k != "gpu" {
			pools[k] = v
		}
	}
	cfg.Worker.Pools = pools
	in2 := controlplanetest.Start(t, &cfg, true)
	_, err := v1.NewEnrollServiceClient(in2.Conn).Enroll(context.Background(), &v1.EnrollRequest{JoinToken: created.JoinToken, CsrPem: csr(t)})
	wantCode(t, "pool gone", err, codes.PermissionDenied)
	if err == nil || !strings.Contains(err.Error(), "no longer exists") {
		t.Errorf("message: %v", err)
	}
}

func TestMachinesAcrossWorkspaces(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, nil)
	_, otherTok := secondWorkspace(t, b.in, "other")
	octx := withToken(context.Background(), otherTok)
	created := b.create(t, "default")
	list, err := b.machines.ListMachines(octx, &v1.ListMachinesRequest{})
	if err != nil || len(list.Machines) != 0 {
		t.Errorf("other workspace lists %v (%v)", list, err)
	}
	_, err = b.machines.GetMachine(octx, &v1.GetMachineRequest{Id: created.Machine.Id})
	wantCode(t, "get other's machine", err, codes.NotFound)
	_, err = b.machines.DeleteMachine(octx, &v1.DeleteMachineRequest{Id: created.Machine.Id})
	wantCode(t, "delete other's machine", err, codes.NotFound)
	pools, err := v1.NewPoolServiceClient(b.in.Conn).ListPools(octx, &v1.ListPoolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pools.Pools {
		if p.Machines != 0 {
			t.Errorf("other workspace counts %d machines in pool %s", p.Machines, p.Name)
		}
	}
}

func TestPoolsList(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, func(c *config.Config) {
		c.Worker.Pools["gpu"] = config.Pool{Runtime: "runsc", GPUType: "l40s", Security: config.ContainerSecurity{Seccomp: "log"}}
	})
	b.create(t, "gpu")
	b.create(t, "gpu")
	resp, err := v1.NewPoolServiceClient(b.in.Conn).ListPools(b.ctx, &v1.ListPoolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Pools) != 2 || resp.Pools[1].Name != "gpu" {
		t.Fatalf("pools = %v", resp.Pools)
	}
	gpu := resp.Pools[1]
	if gpu.Machines != 2 || gpu.MachinesOnline != 0 || gpu.Security.Seccomp != "log" || gpu.Security.Profile != "hardened" || gpu.Security.Runtime != "runsc" {
		t.Errorf("gpu pool = %+v", gpu)
	}
}

func TestAgentDownload(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, nil)
	base := "http://" + b.in.Server.RESTAddr() + "/agent/v1/download/"
	resp, err := http.Get(base + "linux-amd64")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sum := sha256.Sum256(body)
	if resp.StatusCode != 200 || hex.EncodeToString(sum[:]) != b.agentSum {
		t.Errorf("download: %d, checksum mismatch", resp.StatusCode)
	}
	for path, code := range map[string]int{"linux-arm64": 404, "windows-amd64": 400, "..%2F..%2F..%2Fetc%2Fpasswd": 400, "../../etc/passwd": 404} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != code || strings.Contains(string(body), "root:") {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, code)
		}
	}
}

func TestNoAgentBinaryIsAClearError(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, func(c *config.Config) { c.Controlplane.AgentBinariesDir = t.TempDir() })
	_, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default"})
	wantCode(t, "no agent binary", err, codes.FailedPrecondition)
	if err == nil || !strings.Contains(err.Error(), "LEVERS9_AGENT_DEV_BUILDS") {
		t.Errorf("message: %v", err)
	}
}

func TestDevBuildNeedsTheSetting(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, nil)
	_, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default", DevBuild: true})
	wantCode(t, "dev build with dev builds off", err, codes.FailedPrecondition)
	if err == nil || !strings.Contains(err.Error(), "LEVERS9_AGENT_DEV_BUILDS") {
		t.Errorf("message: %v", err)
	}
	resp, err := http.Get("http://" + b.in.Server.RESTAddr() + "/agent/v1/download/linux-amd64?dev=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("dev download with dev builds off: %d", resp.StatusCode)
	}
}
