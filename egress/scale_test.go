package egress

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestManyContainers attaches a node's worth of containers: each gets its
// own addresses and chain, and one apply stays cheap enough for the agent's
// start path (the time per attach is logged).
func TestManyContainers(t *testing.T) {
	w := newWorld(t)
	nb := setupNode(t, w, w.config(ModeEnforce))
	ctx := context.Background()
	const extra = 20
	seen := map[string]bool{nb.a.IPv4.String(): true, nb.b.IPv4.String(): true}
	start := time.Now()
	for i := 0; i < extra; i++ {
		att, err := nb.node.AddContainer(ctx, ContainerNet{ID: fmt.Sprintf("many-%d", i), Task: "t", Pool: "gpu"})
		if err != nil {
			t.Fatal(err)
		}
		if seen[att.IPv4.String()] {
			t.Fatalf("address %s handed out twice", att.IPv4)
		}
		seen[att.IPv4.String()] = true
	}
	per := time.Since(start) / extra
	t.Logf("AddContainer with up to %d containers: %s each", extra+2, per)
	start = time.Now()
	if err := nb.node.Collect(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("Collect with %d containers: %s", extra+2, time.Since(start))
	if _, err := probe(nb.a.NetnsPath, "tcp", "169.254.169.254:80"); err == nil {
		t.Error("metadata reachable with many containers")
	}
	for i := 0; i < extra; i++ {
		if err := nb.node.RemoveContainer(ctx, fmt.Sprintf("many-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Left: a and b (namespace, veth, state dir each) and the bridge.
	if objs := ourObjects(t, w); len(objs) != 7 {
		t.Errorf("objects after removing the extra containers: %v", objs)
	}
}
