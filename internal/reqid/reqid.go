// Package reqid gives every API call a request id that follows it from the
// server through the edge to the agent: accepted from (or made for) the
// X-Request-Id header, returned on the answer, carried in the context and
// on each hop's request, and added by a slog.Handler to every line logged
// with that context. It must stay free of any component's logic.
package reqid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
)

// Header carries the id on requests and answers.
const Header = "X-Request-Id"

// MaxLen bounds an id a client chooses.
const MaxLen = 64

// Attr is the log attribute that carries the id.
const Attr = "request"

type key struct{}

// New makes an id: 16 hex digits.
func New() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Valid reports whether a client's id may be used as it is: 1 to MaxLen
// letters, digits and - _ . : (nothing that could break a log line or a
// header).
func Valid(id string) bool {
	if id == "" || len(id) > MaxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-' || c == '_' || c == '.' || c == ':':
		default:
			return false
		}
	}
	return true
}

// With returns ctx carrying id.
func With(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, key{}, id)
}

// From returns the id ctx carries, or "".
func From(ctx context.Context) string {
	id, _ := ctx.Value(key{}).(string)
	return id
}

// FromRequest returns the request's id: its header's if valid, else a new
// one.
func FromRequest(r *http.Request) string {
	if id := r.Header.Get(Header); Valid(id) {
		return id
	}
	return New()
}

// Middleware gives each request its id (FromRequest), puts it in the
// request's context and header (so that a proxy passes it on) and on the
// answer.
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, Request(w, r))
	})
}

// Request is Middleware for one request: it returns r with its id in the
// context and header, and sets the id on w's answer.
func Request(w http.ResponseWriter, r *http.Request) *http.Request {
	id := FromRequest(r)
	w.Header().Set(Header, id)
	r = r.WithContext(With(r.Context(), id))
	if r.Header.Get(Header) != id {
		r.Header = r.Header.Clone()
		r.Header.Set(Header, id)
	}
	return r
}

// Transport sends the id of each request's context in its header (unless
// the request already has one), so that the next hop logs it too.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if _, ok := base.(transport); ok {
		return base
	}
	return transport{base}
}

type transport struct{ base http.RoundTripper }

func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if id := From(req.Context()); id != "" && req.Header.Get(Header) == "" {
		req = req.Clone(req.Context())
		req.Header.Set(Header, id)
	}
	return t.base.RoundTrip(req)
}

// Logger returns l with a Handler that adds the context's id to each line
// logged with a context (the *Context methods). l already so wrapped is
// returned as it is.
func Logger(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(handler); ok {
		return l
	}
	return slog.New(handler{l.Handler()})
}

type handler struct{ inner slog.Handler }

func (h handler) Enabled(ctx context.Context, lvl slog.Level) bool { return h.inner.Enabled(ctx, lvl) }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	if id := From(ctx); id != "" {
		r = r.Clone()
		r.AddAttrs(slog.String(Attr, id))
	}
	return h.inner.Handle(ctx, r)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler { return handler{h.inner.WithAttrs(as)} }
func (h handler) WithGroup(name string) slog.Handler    { return handler{h.inner.WithGroup(name)} }
