package agents

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

// Forwarding: a replica that does not hold an agent's tunnel publishes the
// marshalled request on the holder's channel (levers9:replica:<id>); the
// holder invokes it on the tunnel and publishes the reply on the sender's
// channel. Redis pub/sub loses messages only when a replica is down, and
// then the caller's deadline ends the call with Unavailable.
//
// Every message is signed for the replica it is addressed to (stamp, in
// replicaauth.go), its body (request, response, status message) sealed for
// it (forwardseal.go), and it is opened only once; anything else on the channel is
// dropped and counted. Before the first call to a replica (and again after
// proofTTL) the caller pings it: a replica named by a presence record is
// trusted only once it has answered a signed pong.
type forwardMsg struct {
	stamp
	// V is the format version (forwardVersion; absent in v1).
	V         int    `json:"v,omitempty"`
	Kind      string `json:"kind"` // call, reply, drop, ping, pong
	ID        string `json:"id,omitempty"`
	From      string `json:"from,omitempty"`
	MachineID string `json:"machine,omitempty"`
	Method    string `json:"method,omitempty"`
	TimeoutMS int64  `json:"timeoutMs,omitempty"`
	Code      uint32 `json:"code,omitempty"`
	// Sealed is Payload and Message encrypted (forwardseal.go); only it
	// travels.
	Sealed []byte `json:"sealed,omitempty"`
	// Payload (the marshalled request or response) and Message (a reply's
	// status message) are the body: set by the sender, filled by
	// decodeForward, never on the wire in clear.
	Payload []byte `json:"-"`
	Message string `json:"-"`
	// V1Payload and V1Message are where a v1 replica sent the body in
	// clear; read only to recognise (and refuse) such a message.
	V1Payload []byte `json:"payload,omitempty"`
	V1Message string `json:"message,omitempty"`
}

const (
	kindCall  = "call"
	kindReply = "reply"
	kindDrop  = "drop"
	kindPing  = "ping"
	kindPong  = "pong"

	forwardPurpose = "forward"
	// proofTTL is how long a replica that answered a ping stays trusted.
	proofTTL = 10 * time.Second
	// proofTimeout bounds a ping.
	proofTimeout = 2 * time.Second
)

// agentMethods and clusterAgentMethods are the only services a forwarded
// call may invoke: what the controlplane pushes to agents.
var (
	agentMethods        = "/" + agentv1.Agent_ServiceDesc.ServiceName + "/"
	clusterAgentMethods = "/" + agentv1.ClusterAgent_ServiceDesc.ServiceName + "/"
)

func forwardable(method string) bool {
	return strings.HasPrefix(method, agentMethods) || strings.HasPrefix(method, clusterAgentMethods)
}

// header is the message's fields but the body and the stamp, with the
// addressee: the associated data of the sealed body.
func (m *forwardMsg) header(to string) []string {
	return []string{"v" + strconv.Itoa(m.V), to, m.Kind, m.ID, m.From, m.MachineID, m.Method,
		strconv.FormatInt(m.TimeoutMS, 10), strconv.FormatUint(uint64(m.Code), 10)}
}

// fields is what the MAC covers: the header and the sealed body.
func (m *forwardMsg) fields(to string) []string {
	return append(m.header(to), string(m.Sealed))
}

// v1Fields is what a v1 replica's MAC covered.
func (m *forwardMsg) v1Fields(to string) []string {
	return []string{to, m.Kind, m.ID, m.From, m.MachineID, m.Method, string(m.V1Payload),
		strconv.FormatInt(m.TimeoutMS, 10), strconv.FormatUint(uint64(m.Code), 10), m.V1Message}
}

// encodeForward seals msg's body and signs msg for replica to.
func encodeForward(a *replicaAuth, to string, msg forwardMsg) []byte {
	msg.V, msg.Sealed, msg.V1Payload, msg.V1Message = forwardVersion, nil, nil, ""
	if len(msg.Payload) > 0 || msg.Message != "" {
		msg.Sealed = a.sealBody(lengthPrefixed(msg.header(to)...), msg.body())
	}
	msg.stamp = a.sign(forwardPurpose, msg.fields(to)...)
	b, _ := json.Marshal(msg)
	return b
}

// decodeForward parses a message read on self's channel, checks it and
// opens its body. A message of another format version is refused as
// old_version (an authentic v1 message) or unknown_version.
func decodeForward(a *replicaAuth, self string, raw []byte) (forwardMsg, error) {
	var msg forwardMsg
	if err := json.Unmarshal(raw, &msg); err != nil {
		return forwardMsg{}, fmt.Errorf("decode a replica message: %w", err)
	}
	switch {
	case msg.V == 0:
		if a.verify(msg.stamp, replicaWindow, forwardPurpose, msg.v1Fields(self)...) == nil {
			return forwardMsg{}, &rejection{reason: "old_version", from: msg.From}
		}
		return forwardMsg{}, &rejection{reason: "bad_mac"}
	case msg.V != forwardVersion:
		return forwardMsg{}, &rejection{reason: "unknown_version", from: msg.From}
	}
	if err := a.open(msg.stamp, forwardPurpose, msg.fields(self)...); err != nil {
		return forwardMsg{}, err
	}
	if msg.Sealed != nil {
		body, err := a.openBody(lengthPrefixed(msg.header(self)...), msg.Sealed)
		if err == nil {
			err = msg.setBody(body)
		}
		if err != nil {
			return forwardMsg{}, &rejection{reason: "bad_seal", from: msg.From}
		}
	}
	return msg, nil
}

type forwarder struct {
	r *Registry

	// mu guards pending and proven.
	mu      sync.Mutex
	pending map[string]chan forwardMsg
	// proven maps replicas that answered a ping to when that expires.
	proven map[string]time.Time
}

func newForwarder(r *Registry) *forwarder {
	return &forwarder{r: r, pending: map[string]chan forwardMsg{}, proven: map[string]time.Time{}}
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
			msg, err := decodeForward(f.r.auth, f.r.replica, []byte(m.Payload))
			if err != nil {
				f.r.auth.reject("replica channel", err)
				return
			}
			f.handle(ctx, wg, msg)
		})
	}()
	return nil
}

func (f *forwarder) handle(ctx context.Context, wg *sync.WaitGroup, msg forwardMsg) {
	switch msg.Kind {
	case kindReply, kindPong:
		f.mu.Lock()
		ch, ok := f.pending[msg.ID]
		f.mu.Unlock()
		if ok {
			select {
			case ch <- msg:
			default:
			}
		}
	case kindDrop:
		if a, ok := f.r.local(msg.MachineID); ok {
			_ = a.Session.Close()
		}
	case kindPing:
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, proofTimeout)
			defer cancel()
			_, _ = f.publish(pctx, msg.From, forwardMsg{Kind: kindPong, ID: msg.ID, From: f.r.replica})
		}()
	case kindCall:
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.serveCall(ctx, msg)
		}()
	}
}

// publish signs msg for replica and sends it; n is how many listened.
func (f *forwarder) publish(ctx context.Context, replica string, msg forwardMsg) (int64, error) {
	return f.r.cfg.Redis.Publish(ctx, bus.ReplicaChannel(replica), encodeForward(f.r.auth, replica, msg)).Result()
}

// serveCall runs a forwarded call on the local tunnel and replies.
func (f *forwarder) serveCall(ctx context.Context, msg forwardMsg) {
	reply := forwardMsg{Kind: kindReply, ID: msg.ID, From: f.r.replica}
	var err error
	if !forwardable(msg.Method) {
		err = status.Errorf(codes.PermissionDenied, "only %s* and %s* calls are forwarded, not %s", agentMethods, clusterAgentMethods, msg.Method)
	}
	var conn grpc.ClientConnInterface
	if err == nil {
		conn, err = f.r.hub.Conn(msg.MachineID)
	}
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, time.Duration(msg.TimeoutMS)*time.Millisecond)
		var out rawMessage
		err = conn.Invoke(cctx, msg.Method, &rawMessage{b: msg.Payload}, &out, grpc.ForceCodecV2(rawCodec{}))
		cancel()
		reply.Payload = out.b
	}
	if err != nil {
		// The hub's errors are errdefs kinds, not statuses: "not connected
		// to this replica" must cross as Unavailable so the caller sends
		// again, not as Unknown.
		st := status.Convert(errdefs.ToGRPC(err))
		reply.Code, reply.Message = uint32(st.Code()), st.Message()
	}
	f.r.metrics.forwarded.WithLabelValues("served").Inc()
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, _ = f.publish(pctx, msg.From, reply)
}

func (f *forwarder) sendDrop(ctx context.Context, replica, machineID string) {
	if err := f.prove(ctx, replica); err != nil {
		f.r.cfg.Log.Warn("drop not forwarded: the replica named by the presence record did not answer a ping", "machine_id", machineID, "replica", replica, "err", err)
		return
	}
	_, _ = f.publish(ctx, replica, forwardMsg{Kind: kindDrop, MachineID: machineID, From: f.r.replica})
}

// prove makes sure replica is a controlplane replica that answers on its
// channel: a signed ping answered by a signed pong from it, remembered for
// proofTTL.
func (f *forwarder) prove(ctx context.Context, replica string) error {
	now := f.r.cfg.Clock.Now()
	f.mu.Lock()
	until, ok := f.proven[replica]
	f.mu.Unlock()
	if ok && now.Before(until) {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, proofTimeout)
	defer cancel()
	rep, err := f.roundTrip(pctx, replica, "", forwardMsg{Kind: kindPing})
	if err != nil {
		return err
	}
	if rep.Kind != kindPong {
		return status.Errorf(codes.Unavailable, "replica %s answered a ping with %q", replica, rep.Kind)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.proven) > 1000 {
		for k, u := range f.proven {
			if now.After(u) {
				delete(f.proven, k)
			}
		}
	}
	f.proven[replica] = now.Add(proofTTL)
	return nil
}

// roundTrip sends msg (a call or a ping) to replica and waits for the
// answer with the same ID from that replica.
func (f *forwarder) roundTrip(ctx context.Context, replica, machineID string, msg forwardMsg) (forwardMsg, error) {
	msg.ID, msg.From = ids.New("fwd"), f.r.replica
	ch := make(chan forwardMsg, 1)
	f.mu.Lock()
	f.pending[msg.ID] = ch
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.pending, msg.ID)
		f.mu.Unlock()
	}()
	n, err := f.publish(ctx, replica, msg)
	if err != nil {
		return forwardMsg{}, status.Errorf(codes.Unavailable, "forward to replica %s: %v", replica, err)
	}
	if n == 0 {
		if machineID == "" {
			return forwardMsg{}, errdefs.UnavailableWithReason(fmt.Errorf("replica %s is gone", replica), errdefs.ReasonNotDelivered)
		}
		return forwardMsg{}, errdefs.UnavailableWithReason(fmt.Errorf("replica %s holding machine %s is gone", replica, machineID), errdefs.ReasonNotDelivered)
	}
	for {
		select {
		case <-ctx.Done():
			return forwardMsg{}, status.FromContextError(ctx.Err()).Err()
		case rep := <-ch:
			if rep.From == replica {
				return rep, nil
			}
		}
	}
}

// call forwards one unary call to replica and waits for its reply.
func (f *forwarder) call(ctx context.Context, replica, machineID, method string, payload []byte) ([]byte, error) {
	if err := f.prove(ctx, replica); err != nil {
		return nil, err
	}
	timeout := 15 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	f.r.metrics.forwarded.WithLabelValues("sent").Inc()
	rep, err := f.roundTrip(ctx, replica, machineID, forwardMsg{Kind: kindCall, MachineID: machineID, Method: method,
		Payload: payload, TimeoutMS: timeout.Milliseconds()})
	if err != nil {
		return nil, err
	}
	if rep.Kind != kindReply {
		return nil, status.Errorf(codes.Unavailable, "replica %s answered a call with %q", replica, rep.Kind)
	}
	if rep.Code != 0 {
		return nil, status.Error(codes.Code(rep.Code), rep.Message)
	}
	return rep.Payload, nil
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
