package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// TestRetryAfter: refusals that waiting cures say when to come back; a
// used-up quota does not.
func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		retry  string
	}{
		{"no room", fmt.Errorf("no node has room: %w", errdefs.ErrResourceExhausted), 429, "1"},
		{"quota", fmt.Errorf("tenant t: %w", errdefs.ErrQuotaExceeded), 429, ""},
		{"unavailable", fmt.Errorf("node away: %w", errdefs.ErrUnavailable), 503, "1"},
		{"bad input", errdefs.Invalid("bad"), 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			WriteError(w, httptest.NewRequest("POST", "/v1/sandboxes", nil), tc.err)
			if w.Code != tc.status || w.Header().Get("Retry-After") != tc.retry {
				t.Fatalf("status %d, Retry-After %q; want %d, %q", w.Code, w.Header().Get("Retry-After"), tc.status, tc.retry)
			}
		})
	}
}

// TestClientGone: an error caused by the client leaving is not logged as
// an internal error.
func TestClientGone(t *testing.T) {
	var logs bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	defer slog.SetDefault(prev)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := httptest.NewRecorder()
	WriteError(w, httptest.NewRequest("POST", "/v1/sandboxes", nil).WithContext(ctx), context.Canceled)
	if strings.Contains(logs.String(), "internal error") {
		t.Fatalf("logged: %s", logs.String())
	}
	WriteError(w, httptest.NewRequest("POST", "/v1/sandboxes", nil), errors.New("boom"))
	if !strings.Contains(logs.String(), "internal error") {
		t.Fatalf("a real internal error was not logged: %q", logs.String())
	}
}
