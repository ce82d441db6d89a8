package tasks

import (
	"context"
	"fmt"
)

// ReconcileForTest runs one reconcile pass of a Kubernetes pool now.
func (w *Workers) ReconcileForTest(ctx context.Context, pool string) error {
	for _, tg := range w.targets(ctx) {
		if tg.pool == pool && tg.agentID == "" {
			return w.reconcile(ctx, tg)
		}
	}
	return fmt.Errorf("no Kubernetes pool %s with a client", pool)
}

// JudgeMounts is judgeMounts.
var JudgeMounts = judgeMounts
