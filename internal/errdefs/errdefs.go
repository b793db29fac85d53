// Package errdefs is the small set of error classes every dsec component
// wraps its errors in. Code deep in the stack says what went wrong
// (fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)); only the HTTP
// edges turn a class into a status code and back. It must never import
// anything but the api package.
package errdefs

import (
	"context"
	"errors"
	"fmt"

	"github.com/dsec-project/dsec/api"
)

// The classes. Wrap them with %w; test them with errors.Is.
var (
	ErrInvalid            = errors.New("invalid argument")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrTooLarge           = errors.New("too large")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
)

// ErrQuotaExceeded is a resource exhausted that waiting does not cure: the
// tenant's quota is used up until the tenant frees some of it or an admin
// raises it. Its answers carry no Retry-After.
var ErrQuotaExceeded = fmt.Errorf("tenant quota exceeded: %w", ErrResourceExhausted)

var classes = []struct {
	err  error
	code string
}{
	{context.DeadlineExceeded, api.CodeDeadlineExceeded},
	{ErrInvalid, api.CodeInvalid},
	{ErrUnauthenticated, api.CodeUnauthenticated},
	{ErrPermissionDenied, api.CodePermissionDenied},
	{ErrNotFound, api.CodeNotFound},
	{ErrAlreadyExists, api.CodeAlreadyExists},
	{ErrFailedPrecondition, api.CodeFailedPrecondition},
	{ErrTooLarge, api.CodeTooLarge},
	{ErrResourceExhausted, api.CodeResourceExhausted},
	{ErrUnavailable, api.CodeUnavailable},
}

// Invalid returns an ErrInvalid with a message.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// NotFound returns an ErrNotFound naming what was not found.
func NotFound(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrNotFound)
}

// Code is the API error code of err. Errors that carry an *api.Error (from
// a remote component) keep its code.
func Code(err error) string {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return api.CodeInternal
}

// FromAPI turns an error received from a remote dsec component back into
// one that matches its class with errors.Is.
func FromAPI(e *api.Error) error {
	for _, c := range classes {
		if c.code == e.Code {
			return &remoteError{e: e, class: c.err}
		}
	}
	return e
}

type remoteError struct {
	e     *api.Error
	class error
}

func (r *remoteError) Error() string { return r.e.Message }

func (r *remoteError) Unwrap() []error { return []error{r.class, r.e} }
