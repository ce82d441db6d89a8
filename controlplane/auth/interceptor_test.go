package auth

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// scriptedTokens answers UseToken with whatever the test set last, and
// tells the test of each call.
type scriptedTokens struct {
	calls chan struct{}
	// mu guards tok and err.
	mu  sync.Mutex
	tok store.Token
	err error
}

func (s *scriptedTokens) set(tok store.Token, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tok, s.err = tok, err
}

func (s *scriptedTokens) UseToken(ctx context.Context, id string) (store.Token, error) {
	s.mu.Lock()
	tok, err := s.tok, s.err
	s.mu.Unlock()
	select {
	case s.calls <- struct{}{}:
	default:
	}
	return tok, err
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c ctxStream) Context() context.Context { return c.ctx }

// An open stream is re-checked every Recheck: Postgres being away keeps
// it, a revoke ends it with Unauthenticated.
func TestStreamEndsWhenTokenRevoked(t *testing.T) {
	id, raw, hash := Mint()
	tokens := &scriptedTokens{calls: make(chan struct{}, 1)}
	active := store.Token{ID: id, WorkspaceID: "ws_1", Role: store.RoleMember, Hash: hash}
	tokens.set(active, nil)
	fake := clock.NewFake(time.Unix(1e9, 0))
	a := &Authenticator{Store: tokens, Clock: fake}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+raw))

	ended := make(chan error, 1)
	go func() {
		ended <- a.Stream()(nil, ctxStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: v1.TaskService_FollowTask_FullMethodName},
			func(_ any, ss grpc.ServerStream) error {
				if p, _ := FromContext(ss.Context()); p.Role != store.RoleMember {
					return fmt.Errorf("principal %+v", p)
				}
				<-ss.Context().Done()
				return status.Error(codes.Canceled, "handler saw the end")
			})
	}()
	<-tokens.calls // the check at the start
	done := make(chan struct{})
	defer close(done)
	if !fake.BlockUntil(done, 1) {
		t.Fatal("no re-check armed")
	}

	tokens.set(store.Token{}, fmt.Errorf("look up token: postgres unreachable: %w", errdefs.ErrUnavailable))
	fake.Advance(DefaultRecheck)
	<-tokens.calls
	select {
	case err := <-ended:
		t.Fatalf("the stream ended while Postgres was away: %v", err)
	case <-time.After(100 * time.Millisecond):
	}

	revokedAt := time.Unix(1e9, 0)
	active.RevokedAt = &revokedAt
	tokens.set(active, nil)
	fake.Advance(DefaultRecheck)
	select {
	case err := <-ended:
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "was revoked") {
			t.Errorf("the stream ended with %v, want Unauthenticated saying the token was revoked", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream of a revoked token is still open")
	}
}
