package api

import "net/http"

// Error codes, one per class of failure. The HTTP status of each is fixed
// by HTTPStatus.
const (
	CodeInvalid            = "invalid_argument"
	CodeUnauthenticated    = "unauthenticated"
	CodePermissionDenied   = "permission_denied"
	CodeNotFound           = "not_found"
	CodeAlreadyExists      = "already_exists"
	CodeFailedPrecondition = "failed_precondition"
	CodeTooLarge           = "too_large"
	CodeResourceExhausted  = "resource_exhausted"
	CodeDeadlineExceeded   = "deadline_exceeded"
	CodeUnavailable        = "unavailable"
	CodeInternal           = "internal"
)

// Error is the body of every error response, inside {"error": ...}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// ErrorResponse wraps Error on the wire.
type ErrorResponse struct {
	Error *Error `json:"error"`
}

var statusOf = map[string]int{
	CodeInvalid:            http.StatusBadRequest,
	CodeUnauthenticated:    http.StatusUnauthorized,
	CodePermissionDenied:   http.StatusForbidden,
	CodeNotFound:           http.StatusNotFound,
	CodeAlreadyExists:      http.StatusConflict,
	CodeFailedPrecondition: http.StatusConflict,
	CodeTooLarge:           http.StatusRequestEntityTooLarge,
	CodeResourceExhausted:  http.StatusTooManyRequests,
	CodeDeadlineExceeded:   http.StatusGatewayTimeout,
	CodeUnavailable:        http.StatusServiceUnavailable,
	CodeInternal:           http.StatusInternalServerError,
}

// HTTPStatus is the status an error code is sent with.
func HTTPStatus(code string) int {
	if s, ok := statusOf[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// CodeForStatus guesses the code of an error response that carried no body
// (a proxy's 502, say).
func CodeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return CodeInvalid
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermissionDenied
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeFailedPrecondition
	case http.StatusRequestEntityTooLarge:
		return CodeTooLarge
	case http.StatusTooManyRequests:
		return CodeResourceExhausted
	case http.StatusGatewayTimeout:
		return CodeDeadlineExceeded
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return CodeUnavailable
	}
	return CodeInternal
}
