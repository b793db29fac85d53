package reqid

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"abc-123_X.y:z", true},
		{strings.Repeat("a", MaxLen), true},
		{"", false},
		{strings.Repeat("a", MaxLen+1), false},
		{"a b", false},
		{"a\nb", false},
		{"a=b", false},
		{"é", false},
	} {
		if got := Valid(tc.id); got != tc.want {
			t.Errorf("Valid(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
	if id := New(); !Valid(id) || len(id) != 16 {
		t.Errorf("New() = %q", id)
	}
}

// TestMiddleware: a valid id is kept, an invalid or missing one replaced;
// either way it is in the context, on the request's header and on the
// answer.
func TestMiddleware(t *testing.T) {
	for _, tc := range []struct{ name, sent string }{
		{"chosen", "my-id-1"}, {"missing", ""}, {"invalid", "bad id\x01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var inCtx, inHeader string
			h := Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				inCtx, inHeader = From(r.Context()), r.Header.Get(Header)
			}))
			req := httptest.NewRequest("GET", "/", nil)
			if tc.sent != "" {
				req.Header.Set(Header, tc.sent)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			got := rec.Header().Get(Header)
			if !Valid(got) || inCtx != got || inHeader != got {
				t.Fatalf("answer %q, context %q, header %q", got, inCtx, inHeader)
			}
			if Valid(tc.sent) != (got == tc.sent) {
				t.Fatalf("sent %q, got %q", tc.sent, got)
			}
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestTransport(t *testing.T) {
	var got string
	rt := Transport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = r.Header.Get(Header)
		return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
	}))
	if _, twice := Transport(rt).(transport).base.(transport); twice {
		t.Fatal("Transport wraps twice")
	}
	req, _ := http.NewRequestWithContext(With(context.Background(), "hop-1"), "GET", "http://x/", nil)
	if _, err := rt.RoundTrip(req); err != nil || got != "hop-1" {
		t.Fatalf("sent %q, %v", got, err)
	}
	if req.Header.Get(Header) != "" {
		t.Fatal("the caller's request was changed")
	}
	req, _ = http.NewRequest("GET", "http://x/", nil)
	if rt.RoundTrip(req); got != "" {
		t.Fatalf("sent %q without an id in the context", got)
	}
}

func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	l := Logger(slog.New(slog.NewTextHandler(&buf, nil)))
	if Logger(l) != l {
		t.Fatal("Logger wraps twice")
	}
	l = l.With("node", "n1")
	l.InfoContext(With(context.Background(), "req-7"), "hello")
	l.InfoContext(context.Background(), "bye")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "node=n1 request=req-7") || strings.Contains(lines[1], "request=") {
		t.Fatalf("logged:\n%s", buf.String())
	}
}
