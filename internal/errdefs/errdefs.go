// Package errdefs owns levers9's small set of error kinds: not found, already
// exists, invalid argument, failed precondition, unavailable, permission
// denied and unauthenticated. Parts wrap these kinds with %w and the IDs
// involved; only the API edge maps them to gRPC or HTTP codes (see
// ToGRPC/FromGRPC). It must never import another levers9 package. Its API is
// stable: kinds may be added, never renamed.
package errdefs

import (
	"context"
	"errors"
)

// The error kinds. Wrap them: fmt.Errorf("workspace %s: %w", id, errdefs.ErrNotFound).
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrUnavailable        = errors.New("unavailable")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrUnauthenticated    = errors.New("unauthenticated")
)

// IsNotFound reports whether err is of kind ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsAlreadyExists reports whether err is of kind ErrAlreadyExists.
func IsAlreadyExists(err error) bool { return errors.Is(err, ErrAlreadyExists) }

// IsInvalidArgument reports whether err is of kind ErrInvalidArgument.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }

// IsFailedPrecondition reports whether err is of kind ErrFailedPrecondition.
func IsFailedPrecondition(err error) bool { return errors.Is(err, ErrFailedPrecondition) }

// IsUnavailable reports whether err is of kind ErrUnavailable.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// IsPermissionDenied reports whether err is of kind ErrPermissionDenied.
func IsPermissionDenied(err error) bool { return errors.Is(err, ErrPermissionDenied) }

// IsUnauthenticated reports whether err is of kind ErrUnauthenticated.
func IsUnauthenticated(err error) bool { return errors.Is(err, ErrUnauthenticated) }

// IsCanceled reports whether err comes from a cancelled or expired context.
// Such errors are never logged as failures.
func IsCanceled(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// Retryable is implemented by errors that know whether retrying the same
// operation can succeed (tunnel, enrollment, runtimes).
type Retryable interface {
	Retryable() bool
}

// IsRetryable reports whether retrying can help: an error in the chain that
// implements Retryable decides; otherwise only ErrUnavailable is retryable.
func IsRetryable(err error) bool {
	var r Retryable
	if errors.As(err, &r) {
		return r.Retryable()
	}
	return errors.Is(err, ErrUnavailable)
}

type retryableError struct {
	err   error
	retry bool
}

func (e *retryableError) Error() string   { return e.err.Error() }
func (e *retryableError) Unwrap() error   { return e.err }
func (e *retryableError) Retryable() bool { return e.retry }

// WithRetry marks err as retryable or not. A nil err stays nil.
func WithRetry(err error, retry bool) error {
	if err == nil {
		return nil
	}
	return &retryableError{err: err, retry: retry}
}
