package errdefs

import (
	"context"
	"errors"
	"fmt"

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
