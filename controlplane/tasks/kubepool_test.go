package tasks_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/internal/kubecluster/kubetest"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// TestKubernetesPoolReconcilesRace: two replicas' reconciles of one
// Kubernetes pool run at the same instant, round after round, against a
// real API server, with three waiting tasks that each need a whole worker
// whose pods stay Pending: exactly maxWorkers (2) Jobs are made, never
// more (the pool's Redis lock makes one replica at a time decide).
func TestKubernetesPoolReconcilesRace(t *testing.T) {
	kc := kubetest.Start(t)
	const ns = "l9kt-workers"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kube := kc.Clientset()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := config1s(t)
	cfg.Worker.Kubernetes = config.KubeWorkers{Namespace: ns, Image: "registry.example/levers9-worker:t"}
	cfg.Worker.Pools["k"] = config.Pool{Runtime: "runc", Provider: config.ProviderKubernetes, MaxWorkers: 2, IdleTimeout: "1m",
		Shape: config.WorkerShape{CPU: "1", Memory: "1Gi"}, NodeSelector: map[string]string{"levers9.dev/zone": "nowhere"}}
	st, rdb, ws := storeAndRedis(ctx, t, cfg, "kube")
	client := kubeworkers.New(kube, ns)
	replica := func() *tasks.Service {
		svc, err := tasks.New(tasks.Config{Store: st, Redis: rdb, Config: cfg, Agents: func() tasks.Agents { return nil },
			Kube:       func(string) (*kubeworkers.Client, error) { return client, nil },
			WorkerJoin: func() tasks.WorkerJoin { return tasks.WorkerJoin{Controlplane: "cp.example:1993"} }})
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	a, b := replica(), replica()
	for i := 0; i < 3; i++ {
		if _, _, err := a.Submitter.Submit(ctx, ws.ID, &v1.TaskSpec{Pool: "k", CpuMillis: 1000, Command: []string{"true"}}, fmt.Sprint("k-", i)); err != nil {
			t.Fatal(err)
		}
	}
	made := map[string]bool{}
	for round := 0; round < 10; round++ {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, svc := range []*tasks.Service{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if err := svc.Workers.ReconcileForTest(ctx, "k"); err != nil {
					t.Error(err)
				}
			}()
		}
		close(start)
		wg.Wait()
		l, err := kube.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) > 2 {
			t.Fatalf("round %d: %d Jobs, maxWorkers is 2", round, len(l.Items))
		}
		for _, j := range l.Items {
			made[j.Name] = true
		}
	}
	if len(made) != 2 {
		t.Errorf("%d Jobs made over the rounds, want 2", len(made))
	}
}
