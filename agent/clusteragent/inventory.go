package clusteragent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// Nodes is the cluster's inventory: the sum of the allocatable CPU,
// memory and nvidia.com/gpu of its Ready, schedulable nodes, and the
// largest of them (most GPUs, then CPU, then memory). Cordoned and
// NotReady nodes take no worker, so they do not count.
func Nodes(ctx context.Context, kube kubernetes.Interface) (*v1.Inventory, error) {
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the cluster's nodes for the inventory: %w", err)
	}
	inv := &v1.Inventory{Os: "kubernetes"}
	var cpu int64
	var gpus int
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Spec.Unschedulable || !ready(n) {
			continue
		}
		a := n.Status.Allocatable
		size := &v1.NodeSize{Name: n.Name, CpuMillis: a.Cpu().MilliValue(), MemoryBytes: uint64(a.Memory().Value())}
		if q, ok := a[kubeworkers.GPUResource]; ok {
			size.Gpus = int32(q.Value())
		}
		inv.ClusterNodes++
		cpu += size.CpuMillis
		inv.MemoryBytes += size.MemoryBytes
		for g := 0; g < int(size.Gpus); g++ {
			inv.Gpus = append(inv.Gpus, &v1.Gpu{Index: int32(gpus), Uuid: fmt.Sprintf("%s/%d", n.Name, g), Name: string(kubeworkers.GPUResource)})
			gpus++
		}
		if larger(size, inv.LargestNode) {
			inv.LargestNode = size
			inv.Arch = n.Status.NodeInfo.Architecture
			inv.Kernel = n.Status.NodeInfo.KernelVersion
		}
	}
	inv.Cpus = int32(cpu / 1000)
	return inv, nil
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func larger(a, b *v1.NodeSize) bool {
	if b == nil {
		return true
	}
	if a.Gpus != b.Gpus {
		return a.Gpus > b.Gpus
	}
	if a.CpuMillis != b.CpuMillis {
		return a.CpuMillis > b.CpuMillis
	}
	return a.MemoryBytes > b.MemoryBytes
}
