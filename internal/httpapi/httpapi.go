// Package httpapi is what dsec's HTTP servers and clients share at the wire:
// writing and reading JSON bodies and {"error": ...} responses, mapping
// error classes to status codes and back. It must stay free of any
// component's logic.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// MaxJSONBody bounds JSON request bodies.
const MaxJSONBody = 4 << 20

// ErrEmptyBody is returned by DecodeJSON for a request without a body, for
// handlers where the body is optional.
var ErrEmptyBody = fmt.Errorf("empty request body: %w", errdefs.ErrInvalid)

// WriteJSON writes v with a status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// WriteError writes err as {"error": {"code", "message"}} with the status
// of its class. Internal errors are logged; the client gets a reference to
// the log line, not the detail (host paths, runtime messages).
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	code := errdefs.Code(err)
	msg := err.Error()
	if code == api.CodeInternal && r.Context().Err() != nil {
		// The client went away and took the request's context with it:
		// nobody reads this answer, and nothing failed on our side.
		Logger(r.Context()).DebugContext(r.Context(), "request ended by its client", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "request canceled by the client"
	} else if code == api.CodeInternal {
		ref := fmt.Sprintf("%08x", rand.Uint32())
		Logger(r.Context()).ErrorContext(r.Context(), "internal error", "ref", ref, "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error (ref " + ref + " in the server log)"
	}
	if (code == api.CodeResourceExhausted && !errors.Is(err, errdefs.ErrQuotaExceeded)) || code == api.CodeUnavailable {
		// Room frees up and nodes come back: worth a retry, unlike a
		// used-up quota.
		w.Header().Set("Retry-After", "1")
	}
	WriteJSON(w, api.HTTPStatus(code), api.ErrorResponse{Error: &api.Error{Code: code, Message: msg}})
}

type loggerKey struct{}

// WithLogger returns ctx carrying the logger WriteError logs internal
// errors to: the server's or edge's own, so that they carry its attributes
// and the request id.
func WithLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, l)
}

// Logger returns the logger of WithLogger, or slog's default for a handler
// that was given none.
func Logger(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}

// DecodeJSON reads a JSON body into v, rejecting unknown fields, trailing
// data and bodies over MaxJSONBody, with errors of class ErrInvalid or
// ErrTooLarge.
func DecodeJSON(r *http.Request, v any) error {
	body := http.MaxBytesReader(nil, r.Body, MaxJSONBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("request body over %d bytes: %w", MaxJSONBody, errdefs.ErrTooLarge)
		}
		if errors.Is(err, io.EOF) {
			return ErrEmptyBody
		}
		return errdefs.Invalid("malformed JSON body: %v", err)
	}
	if dec.More() {
		return errdefs.Invalid("malformed JSON body: trailing data")
	}
	return nil
}

// ReadError turns a non-2xx response into an error that matches its class
// with errors.Is and carries the server's message.
func ReadError(resp *http.Response) error {
	return errdefs.FromAPI(APIError(resp, nil))
}

// APIError reads a failure response's body: the {"error": ...} it
// carries, or else an error of the status's class whose message describe
// makes of the status and the body (nil: the body, or the status if the
// body is empty).
func APIError(resp *http.Response, describe func(status, body string) string) *api.Error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var er api.ErrorResponse
	if json.Unmarshal(b, &er) == nil && er.Error != nil && er.Error.Code != "" {
		return er.Error
	}
	body := string(bytes.TrimSpace(b))
	msg := body
	switch {
	case describe != nil:
		msg = describe(resp.Status, body)
	case msg == "":
		msg = resp.Status
	}
	return &api.Error{Code: api.CodeForStatus(resp.StatusCode), Message: msg}
}
