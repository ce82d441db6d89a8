package config

import (
	"strings"
	"testing"
	"time"
)

func TestKubernetesPoolLoads(t *testing.T) {
	t.Parallel()
	yml := `
worker:
  imageRegistry: registry.example:5000
  pools:
    gpu:
      provider: kubernetes
      maxWorkers: 3
      shape: {cpu: "8", memory: 32Gi, gpus: 4}
      nodeSelector: {levers9.dev/gpu: "true"}
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      idleTimeout: 30s
      workspaces: [team-a]
`
	c, err := Load(strings.NewReader(yml), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Worker.Pools["gpu"]
	if !p.IsKubernetes() || p.MaxWorkers != 3 || p.Shape.Millis() != 8000 || p.Shape.Bytes() != 32<<30 || p.Idle() != 30*time.Second {
		t.Errorf("pool = %+v", p)
	}
	if got := c.Worker.WorkerImage(); got != "registry.example:5000/levers9-worker:latest" {
		t.Errorf("worker image = %q", got)
	}
	if c.Worker.Kubernetes.Namespace != "levers9-workers" || c.Worker.KubeconfigOf("gpu") != "" {
		t.Errorf("kubernetes = %+v", c.Worker.Kubernetes)
	}
	// The operator's workers: shared with the listed workspaces only.
	if !p.SharedWith("ws_x", "team-a") || p.SharedWith("ws_y", "team-b") {
		t.Error("a kubernetes pool's workspaces list is not honoured")
	}
	if d := c.Worker.Pools["default"]; d.Provider != ProviderMachines || d.MaxWorkers != 0 {
		t.Errorf("default pool = %+v", d)
	}
}

func TestKubernetesPoolValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, yml string
		want      []string
	}{
		{name: "bad values", yml: `
worker:
  kubernetes: {namespace: Bad_NS, controlplane: nohost}
  pools:
    k:
      provider: kubernetes
      maxWorkers: -1
      shape: {cpu: lots, memory: 1Ki, gpus: -2}
      runtime: runsc
      idleTimeout: soon
      tolerations: [{operator: Maybe, effect: Never}, {key: a, operator: Exists, value: b}]
`, want: []string{"worker.pools.k.maxWorkers", "worker.pools.k.shape.cpu", "worker.pools.k.shape.memory", "worker.pools.k.shape.gpus",
			"worker.pools.k.idleTimeout", "worker.pools.k.runtimeClassName", "worker.pools.k.tolerations[0].operator",
			"worker.pools.k.tolerations[0].effect", "worker.pools.k.tolerations[0].key", "worker.pools.k.tolerations[1].value",
			"worker.kubernetes.namespace", "worker.kubernetes.controlplane"}},
		{name: "unknown provider", yml: "worker: {pools: {p: {provider: nomad}}}", want: []string{"worker.pools.p.provider"}},
		{name: "kubernetes keys on a machines pool", yml: "worker: {pools: {p: {maxWorkers: 2, runtimeClassName: gvisor}}}",
			want: []string{"worker.pools.p.maxWorkers", "worker.pools.p.runtimeClassName"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Load(strings.NewReader(tt.yml), nil)
			if err == nil {
				t.Fatal("want errors")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w+":") {
					t.Errorf("error does not name %s:\n%v", w, err)
				}
			}
		})
	}
}
