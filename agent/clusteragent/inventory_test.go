package clusteragent

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/levers9/levers9/internal/kubecluster"
	"github.com/levers9/levers9/internal/kubecluster/kubetest"
)

// The inventory counts the Ready, schedulable nodes of a real API server
// (kwok's kwok-cpu-0 and kwok-gpu-0: 32 CPUs and 256 GiB each, 4 GPUs on
// the second), not a cordoned one nor a NotReady one, however large.
func TestNodesInventory(t *testing.T) {
	kc := kubetest.Start(t)
	kube := kc.Clientset()
	ctx := context.Background()
	huge := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("512"), corev1.ResourceMemory: resource.MustParse("4Ti"),
		kubecluster.GPUResource: resource.MustParse("16")}
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "l9ca-cordoned"}, Spec: corev1.NodeSpec{Unschedulable: true},
			Status: corev1.NodeStatus{Allocatable: huge, Capacity: huge, Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "l9ca-notready"},
			Status: corev1.NodeStatus{Allocatable: huge, Capacity: huge, Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}}},
	} {
		if _, err := kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	inv, err := Nodes(ctx, kube)
	if err != nil {
		t.Fatal(err)
	}
	if inv.ClusterNodes != 2 || inv.Cpus != 64 || inv.MemoryBytes != 512<<30 || len(inv.Gpus) != kubecluster.GPUsPerNode {
		t.Errorf("inventory: %d nodes, %d CPUs, %d bytes, %d GPUs; want 2, 64, 512 GiB, %d", inv.ClusterNodes, inv.Cpus, inv.MemoryBytes, len(inv.Gpus), kubecluster.GPUsPerNode)
	}
	if l := inv.LargestNode; l == nil || l.Name != kubecluster.GPUNode || l.CpuMillis != 32000 || l.MemoryBytes != 256<<30 || l.Gpus != kubecluster.GPUsPerNode {
		t.Errorf("largest node %v, want %s with 32 CPUs, 256 GiB, %d GPUs", l, kubecluster.GPUNode, kubecluster.GPUsPerNode)
	}
}
