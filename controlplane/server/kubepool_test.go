package server_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/kubecluster/kubetest"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// TestKubernetesPoolAcrossReplicas: two replicas reconcile one Kubernetes
// pool against a real API server while its worker pods stay Pending (no
// node matches, as a node group scaling from zero): three tasks each
// needing a whole worker make exactly maxWorkers (2) Jobs, never one more
// over many reconciles of both replicas, and `pool list` on either says
// "waiting for nodes".
func TestKubernetesPoolAcrossReplicas(t *testing.T) {
	kc := kubetest.Start(t)
	kube := kc.Clientset()
	const ns = "l9kr-workers"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b := setupMachines(t, func(c *config.Config) {
		c.Worker.DefaultImage = "busybox:test"
		c.Worker.Kubernetes = config.KubeWorkers{Namespace: ns, Kubeconfig: kc.KubeconfigPath(), Image: "registry.example/levers9-worker:t"}
		c.Worker.Pools["k"] = config.Pool{Runtime: "runc", Provider: config.ProviderKubernetes, MaxWorkers: 2, IdleTimeout: "1m",
			Shape: config.WorkerShape{CPU: "1", Memory: "1Gi"}, NodeSelector: map[string]string{"levers9.dev/zone": "nowhere"}}
	})
	other := secondReplica(t, b.in)
	for i, in := range []*controlplanetest.Instance{b.in, other, b.in} {
		if _, err := v1.NewTaskServiceClient(in.Conn).SubmitTask(b.ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Pool: "k", CpuMillis: 1000,
			Command: []string{"true"}}}); err != nil {
			t.Fatalf("task %d: %v", i, err)
		}
	}
	seen := map[string]bool{}
	most := 0
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		l, err := kube.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: kubeworkers.LabelPool + "=k"})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range l.Items {
			seen[j.Name] = true
		}
		most = max(most, len(l.Items))
		time.Sleep(50 * time.Millisecond)
	}
	if len(seen) != 2 || most != 2 {
		t.Errorf("%d Jobs made (at most %d at once), want exactly maxWorkers = 2: %v", len(seen), most, seen)
	}
	for _, in := range []*controlplanetest.Instance{b.in, other} {
		resp, err := v1.NewPoolServiceClient(in.Conn).ListPools(b.ctx, &v1.ListPoolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.Pools {
			if p.Name == "k" && (p.Status != "waiting for nodes" || p.Workers != 2 || p.MaxWorkers != 2 || p.Provider != "kubernetes") {
				t.Errorf("pool list: %v", p)
			}
		}
	}
}
