package kubeworkers_test

import (
	"context"
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/levers9/levers9/internal/kubecluster"
	"github.com/levers9/levers9/internal/kubecluster/kubetest"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// TestNodeCapacity reads the kwok nodes of a real API server: a 32-CPU
// node and a 32-CPU node with 4 GPUs, 256 GiB each.
func TestNodeCapacity(t *testing.T) {
	t.Parallel()
	kube := kubetest.Start(t).Clientset()
	ctx := context.Background()
	const gib = int64(1) << 30
	for _, tc := range []struct {
		name     string
		selector map[string]string
		want     kubeworkers.Capacity
	}{
		{"all", nil, kubeworkers.Capacity{Nodes: 2, CPUMillis: 64000, MemoryBytes: 512 * gib, GPUs: kubecluster.GPUsPerNode,
			LargestCPUMillis: 32000, LargestMemoryBytes: 256 * gib, LargestGPUs: kubecluster.GPUsPerNode}},
		{"gpu", map[string]string{kubecluster.GPULabel: "true"}, kubeworkers.Capacity{Nodes: 1, CPUMillis: 32000, MemoryBytes: 256 * gib,
			GPUs: kubecluster.GPUsPerNode, LargestCPUMillis: 32000, LargestMemoryBytes: 256 * gib, LargestGPUs: kubecluster.GPUsPerNode}},
		{"none", map[string]string{"levers9.dev/zone": "nowhere"}, kubeworkers.Capacity{}},
	} {
		got, err := kubeworkers.NodeCapacity(ctx, kube, tc.selector)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}

	// A cordoned node gives nothing.
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": true}})
	if _, err := kube.CoreV1().Nodes().Patch(ctx, kubecluster.GPUNode, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := kubeworkers.NodeCapacity(ctx, kube, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Nodes != 1 || got.GPUs != 0 || got.CPUMillis != 32000 {
		t.Errorf("with %s cordoned: %+v", kubecluster.GPUNode, got)
	}
}
