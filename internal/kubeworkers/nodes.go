package kubeworkers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// Capacity is what a cluster's nodes can give worker pods: the sum of the
// allocatable resources of the nodes that take pods, and the largest
// single node (the most one worker pod could ever request).
type Capacity struct {
	Nodes                  int
	CPUMillis, MemoryBytes int64
	GPUs                   int
	// Largest* are per-resource maxima over the nodes, not one node's.
	LargestCPUMillis, LargestMemoryBytes int64
	LargestGPUs                          int
}

// NodeCapacity sums the allocatable CPU, memory and nvidia.com/gpu of the
// nodes matching selector (nil: all) that are Ready and not cordoned. It
// is a cluster agent's inventory; it needs only to list nodes. Taints do
// not exclude a node: worker pods may tolerate them (GPU node groups are
// usually tainted).
func NodeCapacity(ctx context.Context, kube kubernetes.Interface, selector map[string]string) (Capacity, error) {
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: labels.Set(selector).String()})
	if err != nil {
		return Capacity{}, fmt.Errorf("listing nodes (selector %v): %w", selector, err)
	}
	var c Capacity
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Spec.Unschedulable || !ready(n) {
			continue
		}
		a := n.Status.Allocatable
		cpu, mem := a.Cpu().MilliValue(), a.Memory().Value()
		gq := a[GPUResource]
		gpus := int(gq.Value())
		c.Nodes++
		c.CPUMillis += cpu
		c.MemoryBytes += mem
		c.GPUs += gpus
		c.LargestCPUMillis = max(c.LargestCPUMillis, cpu)
		c.LargestMemoryBytes = max(c.LargestMemoryBytes, mem)
		c.LargestGPUs = max(c.LargestGPUs, gpus)
	}
	return c, nil
}

func ready(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}
