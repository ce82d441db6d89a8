package tunnel

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/levers9/levers9/internal/clock"
)

// pushConn is an agent's push ClientConn, made on first use and closed
// once it has carried no call for idle. A ClientConn costs three goroutines
// even when disconnected and five with its transport, and most agents are
// pushed to rarely: an agent that is not being pushed to costs no gRPC
// client state at all.
type pushConn struct {
	identity string
	dial     func(opts ...grpc.DialOption) (*grpc.ClientConn, error)
	idle     time.Duration
	clock    clock.Clock

	// mu guards everything below.
	mu      sync.Mutex
	cc      *grpc.ClientConn
	ended   bool
	calls   int // in flight on cc
	lastUse time.Time
	// reaper runs while cc is open; it is made with the first cc (an agent
	// never pushed to needs none).
	reaper clock.Timer
}

func newPushConn(identity string, idle time.Duration, clk clock.Clock, dial func(opts ...grpc.DialOption) (*grpc.ClientConn, error)) *pushConn {
	return &pushConn{identity: identity, idle: idle, clock: clk, dial: dial}
}

func (p *pushConn) get() (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil, fmt.Errorf("agent %s: session ended: %w", p.identity, ErrAgentNotConnected)
	}
	// A caller about to start a call counts as a use, so the reaper does
	// not close the ClientConn between this return and the call.
	p.lastUse = p.clock.Now()
	if p.cc == nil {
		cc, err := p.dial(grpc.WithChainUnaryInterceptor(p.unary), grpc.WithChainStreamInterceptor(p.stream))
		if err != nil {
			return nil, err
		}
		p.cc = cc
		if p.reaper == nil {
			p.reaper = p.clock.AfterFunc(p.idle, p.reap)
		} else {
			p.reaper.Reset(p.idle)
		}
	}
	return p.cc, nil
}

// reap closes the ClientConn when it has been idle long enough, or looks
// again when it would be.
func (p *pushConn) reap() {
	p.mu.Lock()
	if p.cc == nil || p.ended {
		p.mu.Unlock()
		return
	}
	if rest := p.idle - p.clock.Since(p.lastUse); p.calls > 0 || rest > 0 {
		p.reaper.Reset(max(rest, p.idle/4))
		p.mu.Unlock()
		return
	}
	cc := p.cc
	p.cc = nil
	p.mu.Unlock()
	_ = cc.Close()
}

// end closes the ClientConn for good: the session is over.
func (p *pushConn) end() {
	p.mu.Lock()
	p.ended = true
	cc := p.cc
	p.cc = nil
	if p.reaper != nil {
		p.reaper.Stop()
	}
	p.mu.Unlock()
	if cc != nil {
		_ = cc.Close()
	}
}

func (p *pushConn) begin() {
	p.mu.Lock()
	p.calls++
	p.mu.Unlock()
}

func (p *pushConn) done() {
	p.mu.Lock()
	p.calls--
	p.lastUse = p.clock.Now()
	p.mu.Unlock()
}

func (p *pushConn) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	p.begin()
	defer p.done()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// stream counts a stream as in flight until it ends, in one of the ways
// gRPC lets a caller finish one: RecvMsg returned an error (io.EOF
// included) or the single response of a stream that has one, or the
// caller's context is done.
func (p *pushConn) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	p.begin()
	var once sync.Once
	finish := func() { once.Do(p.done) }
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		finish()
		return nil, err
	}
	stop := context.AfterFunc(ctx, finish)
	return &pushStream{ClientStream: cs, single: !desc.ServerStreams, finish: func() { stop(); finish() }}, nil
}

type pushStream struct {
	grpc.ClientStream
	single bool
	finish func()
}

func (s *pushStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil || s.single {
		s.finish()
	}
	return err
}
