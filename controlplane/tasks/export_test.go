package tasks

import "context"

// ReconcileForTest runs one reconcile pass of a Kubernetes pool now.
func (w *Workers) ReconcileForTest(ctx context.Context, pool string) error {
	return w.reconcile(ctx, pool)
}
