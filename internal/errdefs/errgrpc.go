package errdefs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var kindCodes = []struct {
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
}

// ToGRPC turns err into a gRPC status error carrying its message. Errors
// that already are statuses pass through; unknown kinds become Internal.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	for _, kc := range kindCodes {
		if errors.Is(err, kc.kind) {
			return status.Error(kc.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}

// FromGRPC turns a gRPC status error back into an error of the matching kind,
// keeping the server's message.
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, kc := range kindCodes {
		if st.Code() == kc.code {
			return fmt.Errorf("%s: %w", st.Message(), kc.kind)
		}
	}
	switch st.Code() {
	case codes.Canceled:
		return fmt.Errorf("%s: %w", st.Message(), context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w", st.Message(), context.DeadlineExceeded)
	}
	return err
}

// ReasonAgentNotReady marks an agent's Unavailable refusal of a RunTask that
// came before its session's first heartbeat was answered (and the stop list
// in it applied). The push did not fail: the controlplane sends it again
// without counting it as a lost push.
const ReasonAgentNotReady = "AGENT_SESSION_NOT_READY"

// ReasonNotDelivered marks an Unavailable call that reached no one (a
// forwarded call published to a replica nobody listens for any more): the
// callee surely did not get it, so sending it again is not a re-send.
const ReasonNotDelivered = "NOT_DELIVERED"

// errorDomain is the ErrorInfo domain of levers9's reasons.
const errorDomain = "levers9.dev"

// UnavailableWithReason is a gRPC Unavailable status with err's message
// that carries reason for HasReason to find: as an ErrorInfo detail, and
// at the end of the message ("... [REASON]"), which survives a hop that
// keeps only code and message (forwarding between replicas).
func UnavailableWithReason(err error, reason string) error {
	msg := err.Error() + " [" + reason + "]"
	st, derr := status.New(codes.Unavailable, msg).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain})
	if derr != nil {
		return status.Error(codes.Unavailable, msg)
	}
	return st.Err()
}

// HasReason reports whether err is a gRPC status carrying reason.
func HasReason(err error, reason string) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.Domain == errorDomain && ei.Reason == reason {
			return true
		}
	}
	return strings.HasSuffix(st.Message(), " ["+reason+"]")
}
