package taskrun

import (
	"context"
	"fmt"
	"sync"

	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/sandbox"
)

// networkHook attaches the container to the node's egress network: its
// own namespace, addresses, egress chains and resolv.conf. Stop detaches
// it. Without a node the sandbox gives the container a fresh namespace
// with only loopback, and the hook does nothing.
type networkHook struct {
	node *egress.Node

	// mu guards att.
	mu  sync.Mutex
	att *egress.Attachment
}

var (
	_ Prestarter  = (*networkHook)(nil)
	_ besideImage = (*networkHook)(nil)
	_ Stopper     = (*networkHook)(nil)
)

func (*networkHook) besideImage() {}

func newNetworkHook(node *egress.Node) *networkHook { return &networkHook{node: node} }

func (h *networkHook) Name() string { return "network" }

func (h *networkHook) Prestart(ctx context.Context, req *PrestartRequest, resp *PrestartResponse) error {
	if h.node == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.att == nil {
		// AddContainer is itself idempotent per ID.
		att, err := h.node.AddContainer(ctx, egress.ContainerNet{
			ID: req.ContainerID, Task: req.Task.ID, Pool: req.Task.Pool, Security: req.Task.Network,
		})
		if err != nil {
			return withReason(ReasonNetworkFailed, "the container's network could not be set up on this machine",
				fmt.Errorf("attach network: %w", err))
		}
		h.att = att
	}
	resp.NetNSPath = h.att.NetnsPath
	resp.EgressMode = string(h.att.Mode)
	resp.Mounts = append(resp.Mounts, sandbox.Mount{Source: h.att.ResolvConfPath, Destination: "/etc/resolv.conf", ReadOnly: true})
	return nil
}

// Attachment returns what Prestart attached, nil before or without a node.
func (h *networkHook) Attachment() *egress.Attachment {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.att
}

func (h *networkHook) Stop(ctx context.Context, req *StopRequest) error {
	if h.node == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// RemoveContainer is idempotent and cleans up by name, so it also runs
	// when a failed Prestart left a half-made attachment.
	if err := h.node.RemoveContainer(ctx, req.ContainerID); err != nil {
		return fmt.Errorf("detach network: %w", err)
	}
	h.att = nil
	return nil
}
