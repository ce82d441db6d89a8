package kubeworkers

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// PodGone is what the Watcher reports: a worker pod deleted, being
// deleted, evicted, or failed, so the machine it ran is gone.
type PodGone struct {
	Pod, Pool, MachineID string
	// Why says what happened, for the attempt's message.
	Why string
}

// Watcher reports worker pods going away, once per pod. Start returns once
// its informer has synced; Stop waits for it and is safe twice or before
// Start.
type Watcher struct {
	c      *Client
	pool   string
	notify func(PodGone)

	mu sync.Mutex
	// The fields below are guarded by mu.
	cancel context.CancelFunc
	done   chan struct{}
	// reported holds when each pod was reported, so its deletion after
	// an eviction is not reported again; pruned after reportedMemory.
	reported map[string]time.Time
}

const reportedMemory = 30 * time.Minute

// Watch is a Watcher calling notify (from one goroutine, never
// concurrently) for each worker pod of pool ("" for every pool) that goes
// away.
func (c *Client) Watch(pool string, notify func(PodGone)) *Watcher {
	return &Watcher{c: c, pool: pool, notify: notify, reported: map[string]time.Time{}}
}

// Start runs the informer until Stop, and returns once it has listed the
// pods (or ctx ends first).
func (w *Watcher) Start(ctx context.Context) error {
	w.mu.Lock()
	if w.cancel != nil {
		w.mu.Unlock()
		return fmt.Errorf("worker pod watcher started twice")
	}
	run, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancel, w.done = cancel, make(chan struct{})
	w.mu.Unlock()
	f := informers.NewSharedInformerFactoryWithOptions(w.c.kube, 10*time.Minute, informers.WithNamespace(w.c.ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = selector(w.pool)
		}))
	inf := f.Core().V1().Pods().Informer()
	events := make(chan PodGone, 64)
	// A handler never blocks the informer past Stop.
	send := func(g PodGone) {
		select {
		case events <- g:
		case <-run.Done():
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				if why := goneWhy(p); why != "" {
					send(goneOf(p, why))
				}
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				send(goneOf(p, "pod "+p.Name+" was deleted"))
			}
		},
	})
	if err != nil {
		cancel()
		close(w.done)
		return fmt.Errorf("watching worker pods in namespace %s: %w", w.c.ns, err)
	}
	f.Start(run.Done())
	go func() {
		defer close(w.done)
		defer f.Shutdown()
		for {
			select {
			case <-run.Done():
				return
			case g := <-events:
				if w.firstReport(g.Pod) {
					w.notify(g)
				}
			}
		}
	}()
	synced := make(chan bool, 1)
	go func() { synced <- cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) }()
	select {
	case ok := <-synced:
		if !ok {
			return fmt.Errorf("listing worker pods in namespace %s: %w", w.c.ns, ctx.Err())
		}
	case <-run.Done():
	}
	return nil
}

func (w *Watcher) firstReport(pod string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.reported[pod]; ok {
		return false
	}
	now := time.Now()
	for p, at := range w.reported {
		if now.Sub(at) > reportedMemory {
			delete(w.reported, p)
		}
	}
	w.reported[pod] = now
	return true
}

// Stop ends the watch and waits for it.
func (w *Watcher) Stop() {
	w.mu.Lock()
	cancel, done := w.cancel, w.done
	w.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func goneOf(p *corev1.Pod, why string) PodGone {
	return PodGone{Pod: p.Name, Pool: p.Labels[LabelPool], MachineID: p.Labels[LabelMachine], Why: why}
}

// goneWhy says why a pod's worker is gone ("" while it is not). A pod that
// succeeded is a worker that exited idle: nothing was running on it.
func goneWhy(p *corev1.Pod) string {
	switch {
	case p.Status.Reason == "Evicted":
		return fmt.Sprintf("pod %s was evicted from node %s: %s", p.Name, p.Spec.NodeName, p.Status.Message)
	case p.DeletionTimestamp != nil:
		return fmt.Sprintf("pod %s on node %s is being deleted", p.Name, p.Spec.NodeName)
	case p.Status.Phase == corev1.PodFailed:
		return fmt.Sprintf("pod %s failed on node %s: %s %s", p.Name, p.Spec.NodeName, p.Status.Reason, p.Status.Message)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return fmt.Sprintf("pod %s is being disrupted on node %s: %s", p.Name, p.Spec.NodeName, c.Reason)
		}
	}
	return ""
}
