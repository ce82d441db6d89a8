package kubecluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// KwokAnnotation marks the nodes kwok manages (value "fake").
	KwokAnnotation = "kwok.x-k8s.io/node"
	// GPUResource is the extended resource the NVIDIA device plugin
	// advertises; kwok-gpu-0 has GPUsPerNode of it.
	GPUResource = corev1.ResourceName("nvidia.com/gpu")
	// GPULabel is set to "true" on kwok-gpu-0.
	GPULabel    = "levers9.dev/gpu"
	GPUsPerNode = 4

	CPUNode = "kwok-cpu-0"
	GPUNode = "kwok-gpu-0"
)

// fakeNode is a node kwok manages. Nodes may carry status at create, so the
// capacity (with GPUs) is there before kwok first reports.
func fakeNode(name string, gpus int64) *corev1.Node {
	labels := map[string]string{
		"kubernetes.io/hostname": name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
		"type":                   "kwok",
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	if gpus > 0 {
		labels[GPULabel] = "true"
		capacity[GPUResource] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      labels,
			Annotations: map[string]string{KwokAnnotation: "fake"},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity.DeepCopy()},
	}
}

// setUpNodes creates the fake nodes and waits until they are Ready and the
// default namespace has its service account (pods are refused before).
func (c *Cluster) setUpNodes(ctx context.Context) error {
	nodes := c.clientset.CoreV1().Nodes()
	for _, n := range []*corev1.Node{fakeNode(CPUNode, 0), fakeNode(GPUNode, GPUsPerNode)} {
		if _, err := nodes.Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating node %s: %w", n.Name, err)
		}
	}
	for _, name := range []string{CPUNode, GPUNode} {
		err := c.poll(ctx, "node "+name+" to be Ready and untainted", func(ctx context.Context) (bool, error) {
			n, err := nodes.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			return schedulable(n), nil
		})
		if err != nil {
			return err
		}
	}
	c.log.Info("nodes Ready")
	return c.poll(ctx, "the default service account", func(ctx context.Context) (bool, error) {
		_, err := c.clientset.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, nil
	})
}

// schedulable reports a node Ready and without the taints the node
// lifecycle controller puts on new nodes (not-ready, unreachable) until it
// has seen them Ready: a pod created before would wait for the scheduler's
// backoff, and report the taint instead of a lack of resources.
func schedulable(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			return false
		}
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
