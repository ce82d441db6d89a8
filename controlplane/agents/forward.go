package agents

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/internal/ids"
)

// Forwarding: a replica that does not hold an agent's tunnel publishes the
// marshalled request on the holder's channel (levers9:replica:<id>); the
// holder invokes it on the tunnel and publishes the reply on the sender's
// channel. Redis pub/sub loses messages only when a replica is down, and
// then the caller's deadline ends the call with Unavailable.
type forwardMsg struct {
	Kind      string `json:"kind"` // call, reply, drop
	ID        string `json:"id,omitempty"`
	From      string `json:"from,omitempty"`
	MachineID string `json:"machine,omitempty"`
	Method    string `json:"method,omitempty"`
	Payload   []byte `json:"payload,omitempty"`
	TimeoutMS int64  `json:"timeoutMs,omitempty"`
	Code      uint32 `json:"code,omitempty"`
	Message   string `json:"message,omitempty"`
}

type forwarder struct {
	r *Registry

	// mu guards pending.
	mu      sync.Mutex
	pending map[string]chan forwardMsg
}

func newForwarder(r *Registry) *forwarder {
	return &forwarder{r: r, pending: map[string]chan forwardMsg{}}
}

func (f *forwarder) start(ctx context.Context, wg *sync.WaitGroup) error {
	sub := f.r.cfg.Redis.Subscribe(ctx, bus.ReplicaChannel(f.r.replica))
	// Wait for the subscription so no forwarded call is lost right after Start.
	if _, err := sub.Receive(ctx); err != nil {
		sub.Close()
		return fmt.Errorf("subscribe to %s: %w", bus.ReplicaChannel(f.r.replica), err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		bus.Deliver(ctx, sub, func(m *redis.Message) {
			var msg forwardMsg
			if err := json.Unmarshal([]byte(m.Payload), &msg); err != nil {
				f.r.cfg.Log.Warn("garbage on the replica channel", "err", err)
				return
			}
			f.handle(ctx, wg, msg)
		})
	}()
	return nil
}

func (f *forwarder) handle(ctx context.Context, wg *sync.WaitGroup, msg forwardMsg) {
	switch msg.Kind {
	case "reply":
		f.mu.Lock()
		ch, ok := f.pending[msg.ID]
		f.mu.Unlock()
		if ok {
			select {
			case ch <- msg:
			default:
			}
		}
	case "drop":
		if a, ok := f.r.local(msg.MachineID); ok {
			_ = a.Session.Close()
		}
	case "call":
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.serveCall(ctx, msg)
		}()
	}
}

// serveCall runs a forwarded call on the local tunnel and replies.
func (f *forwarder) serveCall(ctx context.Context, msg forwardMsg) {
	reply := forwardMsg{Kind: "reply", ID: msg.ID}
	conn, err := f.r.hub.Conn(msg.MachineID)
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, time.Duration(msg.TimeoutMS)*time.Millisecond)
		var out rawMessage
		err = conn.Invoke(cctx, msg.Method, &rawMessage{b: msg.Payload}, &out, grpc.ForceCodecV2(rawCodec{}))
		cancel()
		reply.Payload = out.b
	}
	if err != nil {
		st := status.Convert(err)
		reply.Code, reply.Message = uint32(st.Code()), st.Message()
	}
	f.r.metrics.forwarded.WithLabelValues("served").Inc()
	b, _ := json.Marshal(reply)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = f.r.cfg.Redis.Publish(pctx, bus.ReplicaChannel(msg.From), b).Err()
}

func (f *forwarder) sendDrop(ctx context.Context, replica, machineID string) {
	b, _ := json.Marshal(forwardMsg{Kind: "drop", MachineID: machineID, From: f.r.replica})
	_ = f.r.cfg.Redis.Publish(ctx, bus.ReplicaChannel(replica), b).Err()
}

// call forwards one unary call to replica and waits for its reply.
func (f *forwarder) call(ctx context.Context, replica, machineID, method string, payload []byte) ([]byte, error) {
	timeout := 15 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	id := ids.New("fwd")
	ch := make(chan forwardMsg, 1)
	f.mu.Lock()
	f.pending[id] = ch
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.pending, id)
		f.mu.Unlock()
	}()
	b, _ := json.Marshal(forwardMsg{Kind: "call", ID: id, From: f.r.replica, MachineID: machineID, Method: method,
		Payload: payload, TimeoutMS: timeout.Milliseconds()})
	n, err := f.r.cfg.Redis.Publish(ctx, bus.ReplicaChannel(replica), b).Result()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "forward to replica %s: %v", replica, err)
	}
	if n == 0 {
		return nil, status.Errorf(codes.Unavailable, "replica %s holding machine %s is gone", replica, machineID)
	}
	f.r.metrics.forwarded.WithLabelValues("sent").Inc()
	select {
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case rep := <-ch:
		if rep.Code != 0 {
			return nil, status.Error(codes.Code(rep.Code), rep.Message)
		}
		return rep.Payload, nil
	}
}

// forwardConn is a grpc.ClientConnInterface that forwards unary calls.
type forwardConn struct {
	fwd       *forwarder
	replica   string
	machineID string
}

func (c *forwardConn) Invoke(ctx context.Context, method string, args, reply any, _ ...grpc.CallOption) error {
	in, ok := args.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "forward %s: request is not a protobuf message", method)
	}
	b, err := proto.Marshal(in)
	if err != nil {
		return status.Errorf(codes.Internal, "forward %s: %v", method, err)
	}
	out, err := c.fwd.call(ctx, c.replica, c.machineID, method, b)
	if err != nil {
		return err
	}
	return proto.Unmarshal(out, reply.(proto.Message))
}

func (c *forwardConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "streams are not forwarded between replicas")
}
