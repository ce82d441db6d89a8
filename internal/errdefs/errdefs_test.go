package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestGRPCRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kind error
		code codes.Code
	}{
		{ErrNotFound, codes.NotFound},
		{ErrAlreadyExists, codes.AlreadyExists},
		{ErrInvalidArgument, codes.InvalidArgument},
		{ErrFailedPrecondition, codes.FailedPrecondition},
		{ErrUnavailable, codes.Unavailable},
		{ErrPermissionDenied, codes.PermissionDenied},
		{ErrUnauthenticated, codes.Unauthenticated},
		{context.Canceled, codes.Canceled},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
	}
	for _, tt := range tests {
		wrapped := fmt.Errorf("token tok_1: %w", tt.kind)
		g := ToGRPC(wrapped)
		if got := status.Code(g); got != tt.code {
			t.Errorf("ToGRPC(%v) code = %v, want %v", tt.kind, got, tt.code)
		}
		back := FromGRPC(g)
		if !errors.Is(back, tt.kind) {
			t.Errorf("FromGRPC(ToGRPC(%v)) = %v, lost the kind", tt.kind, back)
		}
	}
	if got := status.Code(ToGRPC(errors.New("boom"))); got != codes.Internal {
		t.Errorf("unknown error code = %v, want Internal", got)
	}
	if ToGRPC(nil) != nil || FromGRPC(nil) != nil {
		t.Error("nil must stay nil")
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	base := errors.New("dial")
	if IsRetryable(base) {
		t.Error("plain error must not be retryable")
	}
	if !IsRetryable(fmt.Errorf("x: %w", ErrUnavailable)) {
		t.Error("unavailable must be retryable")
	}
	if !IsRetryable(fmt.Errorf("wrap: %w", WithRetry(base, true))) {
		t.Error("WithRetry(true) lost through wrapping")
	}
	if IsRetryable(WithRetry(fmt.Errorf("x: %w", ErrUnavailable), false)) {
		t.Error("explicit WithRetry(false) must win over the kind")
	}
	if !errors.Is(WithRetry(base, true), base) {
		t.Error("WithRetry must unwrap")
	}
}

func TestReasonSurvivesGRPCAndAMessageOnlyHop(t *testing.T) {
	err := UnavailableWithReason(fmt.Errorf("run task t/1: not ready: %w", ErrUnavailable), ReasonAgentNotReady)
	if status.Code(err) != codes.Unavailable || !HasReason(err, ReasonAgentNotReady) {
		t.Fatalf("%v: code %v, has reason %v", err, status.Code(err), HasReason(err, ReasonAgentNotReady))
	}
	// A replica forwarding the call keeps only code and message.
	hop := status.Error(codes.Unavailable, status.Convert(err).Message())
	if !HasReason(hop, ReasonAgentNotReady) {
		t.Errorf("reason lost over a message-only hop: %v", hop)
	}
	for _, other := range []error{nil, ErrUnavailable, status.Error(codes.Unavailable, "session closed"), UnavailableWithReason(ErrUnavailable, "OTHER")} {
		if HasReason(other, ReasonAgentNotReady) {
			t.Errorf("HasReason(%v) = true", other)
		}
	}
}
