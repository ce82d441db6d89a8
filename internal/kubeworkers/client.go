package kubeworkers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// Client makes and removes worker Jobs in one namespace. Safe for
// concurrent use; every call is one or a few API requests.
type Client struct {
	kube kubernetes.Interface
	ns   string
}

// New is a Client for namespace ns.
func New(kube kubernetes.Interface, ns string) *Client { return &Client{kube: kube, ns: ns} }

// State is where a worker stands, as its Job and pod say.
type State string

const (
	// Starting: the Job exists, its pod is not running yet but has (or
	// will get) a node.
	Starting State = "starting"
	// WaitingForNodes: the pod is unschedulable (a node group scaling
	// from zero, or no node matches).
	WaitingForNodes State = "waiting for nodes"
	Running         State = "running"
	// Finished: the Job succeeded or failed, or its pod is gone.
	Finished State = "finished"
)

// Worker is one worker Job and what its pod says.
type Worker struct {
	Name, Pool, MachineID  string
	State                  State
	CPUMillis, MemoryBytes int64
	GPUs                   int
	// Started is when its pod started running (zero before).
	Started time.Time
}

// Create creates spec's Job, then its join Secret owned by the Job. The
// pod waits for the Secret volume, so the order costs nothing; a failed
// Secret removes the Job again. The token never appears in an error.
func (c *Client) Create(ctx context.Context, spec Spec, token string, caPEM []byte) (*batchv1.Job, error) {
	job, err := c.kube.BatchV1().Jobs(c.ns).Create(ctx, BuildJob(c.ns, spec), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating worker Job for pool %s in namespace %s: %w", spec.Pool, c.ns, err)
	}
	if _, err := c.kube.CoreV1().Secrets(c.ns).Create(ctx, BuildSecret(job, token, caPEM), metav1.CreateOptions{}); err != nil {
		_ = c.Delete(context.WithoutCancel(ctx), job.Name)
		return nil, fmt.Errorf("creating the join Secret of worker Job %s/%s: %w", c.ns, job.Name, err)
	}
	return job, nil
}

// List is every worker of pool ("" for every pool), by name.
func (c *Client) List(ctx context.Context, pool string) ([]Worker, error) {
	opts := metav1.ListOptions{LabelSelector: selector(pool)}
	jobs, err := c.kube.BatchV1().Jobs(c.ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("listing worker Jobs in namespace %s: %w", c.ns, err)
	}
	pods, err := c.kube.CoreV1().Pods(c.ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("listing worker pods in namespace %s: %w", c.ns, err)
	}
	byMachine := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		byMachine[p.Labels[LabelMachine]] = p
	}
	out := make([]Worker, 0, len(jobs.Items))
	for i := range jobs.Items {
		j := &jobs.Items[i]
		w := Worker{Name: j.Name, Pool: j.Labels[LabelPool], MachineID: j.Labels[LabelMachine],
			CPUMillis: quantityInt(j.Annotations, AnnotCPU), MemoryBytes: quantityInt(j.Annotations, AnnotMemory), GPUs: int(quantityInt(j.Annotations, AnnotGPUs))}
		w.State = stateOf(j, byMachine[w.MachineID])
		if p := byMachine[w.MachineID]; p != nil && p.Status.StartTime != nil {
			w.Started = p.Status.StartTime.Time
		}
		out = append(out, w)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

func stateOf(j *batchv1.Job, p *corev1.Pod) State {
	if j.DeletionTimestamp != nil || j.Status.Succeeded > 0 || j.Status.Failed > 0 {
		return Finished
	}
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return Finished
		}
	}
	if p == nil {
		return Starting // the Job controller has not made its pod yet
	}
	if goneWhy(p) != "" {
		return Finished
	}
	switch p.Status.Phase {
	case corev1.PodRunning:
		return Running
	case corev1.PodSucceeded, corev1.PodFailed:
		return Finished
	}
	if unschedulable(p) {
		return WaitingForNodes
	}
	return Starting
}

// unschedulable reports whether the scheduler found no node for the pod.
func unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return true
		}
	}
	return false
}

// Delete removes a worker Job, its pod and its Secret. Idempotent: what is
// already gone is no error.
func (c *Client) Delete(ctx context.Context, name string) error {
	bg := metav1.DeletePropagationBackground
	var errs []error
	if err := c.kube.BatchV1().Jobs(c.ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("deleting worker Job %s/%s: %w", c.ns, name, err))
	}
	if err := c.kube.CoreV1().Secrets(c.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("deleting the join Secret %s/%s: %w", c.ns, name, err))
	}
	return errors.Join(errs...)
}

// selector picks the worker Jobs and pods of pool ("" for every pool).
func selector(pool string) string {
	sel := labels.Set{LabelApp: AppName}
	if pool != "" {
		sel[LabelPool] = pool
	}
	return sel.String()
}
