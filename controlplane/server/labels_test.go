package server_test

import (
	"context"
	"maps"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// TestMachineLabels: labels given at create are stored with the machine,
// shown by get and list, and handed to the agent by its enrollment; a bad
// label is refused with an error naming it.
func TestMachineLabels(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, nil)
	labels := map[string]string{"zone": "eu-west", "example.com/disk": "ssd", "spare": ""}
	created, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default", Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(created.Machine.Labels, labels) {
		t.Errorf("create: labels %v, want %v", created.Machine.Labels, labels)
	}
	got, err := b.machines.GetMachine(b.ctx, &v1.GetMachineRequest{Id: created.Machine.Id})
	if err != nil || !maps.Equal(got.Machine.Labels, labels) {
		t.Errorf("get: labels %v (%v), want %v", got.GetMachine().GetLabels(), err, labels)
	}
	list, err := b.machines.ListMachines(b.ctx, &v1.ListMachinesRequest{})
	if err != nil || len(list.Machines) != 1 || !maps.Equal(list.Machines[0].Labels, labels) {
		t.Errorf("list: %v %v", list, err)
	}
	en, err := b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: created.JoinToken, CsrPem: csr(t)})
	if err != nil || !maps.Equal(en.Labels, labels) {
		t.Errorf("enroll: labels %v (%v), want %v", en.GetLabels(), err, labels)
	}

	for _, tc := range []struct {
		labels map[string]string
		want   string
	}{
		{map[string]string{"bad key": "x"}, `label "bad key": key name "bad key"`},
		{map[string]string{"zone": "-eu"}, `label "zone": value "-eu"`},
		{map[string]string{"Bad_Prefix/zone": "eu"}, `label "Bad_Prefix/zone": key prefix "Bad_Prefix"`},
		{map[string]string{"/zone": "eu"}, `label "/zone": key prefix ""`},
		{map[string]string{strings.Repeat("k", 64): "v"}, `key name "` + strings.Repeat("k", 64)},
		{map[string]string{"zone": strings.Repeat("v", 64)}, `label "zone": value`},
	} {
		_, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "default", Labels: tc.labels})
		wantCode(t, "labels "+tc.want, err, codes.InvalidArgument)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("labels %v: %v, want it to say %s", tc.labels, err, tc.want)
		}
	}
}

// TestNodeSelectorRefusesEnroll: in a pool with a nodeSelector, a machine
// without the selected label, or with another value, is refused at
// enrollment with an error naming the pool and the missing label; its
// token stays unused, so once the operator fixes the selector the same
// join script enrolls. A machine that has the labels enrolls.
func TestNodeSelectorRefusesEnroll(t *testing.T) {
	t.Parallel()
	b := setupMachines(t, func(c *config.Config) {
		c.Worker.Pools["eu"] = config.Pool{Runtime: "runc", NodeSelector: map[string]string{"zone": "eu", "example.com/gpu": "l40s"}}
	})
	unlabelled, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: unlabelled.JoinToken, CsrPem: csr(t)})
	wantCode(t, "no labels", err, codes.PermissionDenied)
	if err == nil || !strings.Contains(err.Error(), `pool "eu"`) || !strings.Contains(err.Error(), "example.com/gpu=l40s, zone=eu") {
		t.Errorf("no labels: %v", err)
	}

	wrong, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "eu", Labels: map[string]string{"zone": "us", "example.com/gpu": "l40s"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: wrong.JoinToken, CsrPem: csr(t)})
	wantCode(t, "wrong value", err, codes.PermissionDenied)
	if err == nil || !strings.Contains(err.Error(), `pool "eu"`) || !strings.Contains(err.Error(), "lacks the label zone=eu") {
		t.Errorf("wrong value: %v", err)
	}
	if len(b.in.Logs.Find("enrollment refused")) < 2 {
		t.Error("no audit line for the refused enrollments")
	}

	right, err := b.machines.CreateMachine(b.ctx, &v1.CreateMachineRequest{Pool: "eu", Labels: map[string]string{"zone": "eu", "example.com/gpu": "l40s", "rack": "7"}})
	if err != nil {
		t.Fatal(err)
	}
	en, err := b.enroll.Enroll(context.Background(), &v1.EnrollRequest{JoinToken: right.JoinToken, CsrPem: csr(t)})
	if err != nil || en.Labels["rack"] != "7" {
		t.Fatalf("matching machine: %v %v", en, err)
	}

	// The refused machine's token was not spent: without the selector,
	// the same token enrolls.
	b.in.Server.Stop()
	cfg := *b.in.Config
	cfg.Worker.Pools = maps.Clone(cfg.Worker.Pools)
	cfg.Worker.Pools["eu"] = config.Pool{Runtime: "runc"}
	in2 := controlplanetest.Start(t, &cfg, true)
	if _, err := v1.NewEnrollServiceClient(in2.Conn).Enroll(context.Background(), &v1.EnrollRequest{JoinToken: wrong.JoinToken, CsrPem: csr(t)}); err != nil {
		t.Errorf("the refused token after the selector was lifted: %v", err)
	}
}
