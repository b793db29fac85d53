package edge

import (
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"sync/atomic"
	"time"

	"github.com/dsec-project/dsec/internal/httpapi"
)

// serveDuplex proxies r through rp in full duplex: the answer is copied
// while the transport still reads the request body. An agent answers once
// it has parsed the request, which may be before the transport has read
// the body to its end; without full duplex an HTTP/1 server closes the
// body at the answer's first flush, the transport's write fails, and it
// closes the connection under the answer being copied (under load,
// answers were cut short: "unexpected EOF", a stream without its exit).
//
// Full duplex asks more of the handler than Go's server checks: the
// request body must have one reader at a time, and no reader once the
// handler has returned. The transport reads the body from its own
// goroutine, which outlives the round trip, and Go's server reads it too
// after the handler, to finish the request: if that read finds the body's
// end, the server starts its read for the next request, and on a kept-alive
// connection the next request's own read then panics with "invalid
// concurrent Body.Read call" (golang/go#68560; an agent that refused the
// connection left the body unread, and the edge logged the panic under
// chaos). So the body goes through a duplexBody that lets one Read in at a
// time and none after detach, and the handler ends with the body either
// read to its end by this goroutine (the server then stops the read it
// started, as for any handler) or left unread on a connection the answer
// closes (Connection: close, set before the answer's header whenever the
// body had not ended).
func serveDuplex(rp *httputil.ReverseProxy, w http.ResponseWriter, r *http.Request) {
	_ = http.NewResponseController(w).EnableFullDuplex() // HTTP/2 is always full duplex
	if r.Body == nil || r.Body == http.NoBody {
		rp.ServeHTTP(w, r)
		return
	}
	body := newDuplexBody(r.Body, r.ContentLength)
	r.Body = body
	defer body.detach(w, r)
	// An answer that starts before the body ended (an upload over its
	// limit, a stream whose process exited while stdin stays open) ends the
	// connection: the rest of the body is never read.
	closeIfUnread := func(w http.ResponseWriter) {
		if !body.ended() {
			w.Header().Set("Connection", "close")
		}
	}
	rp.ModifyResponse = func(*http.Response) error {
		closeIfUnread(w)
		return nil
	}
	onError := rp.ErrorHandler
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		closeIfUnread(w)
		if onError != nil {
			onError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusBadGateway) // as ReverseProxy's own
	}
	rp.ServeHTTP(w, r)
}

// bodyWait bounds how long a proxy waits, after the answer, for a read of
// the request body that it cannot interrupt (the ResponseWriter has no
// read deadline: not a net/http server's).
var bodyWait = 30 * time.Second

// errBodyDetached is what the transport reads once the handler is done.
var errBodyDetached = errors.New("request body read after its handler returned")

// duplexBody is a request body read by at most one goroutine at a time,
// and by none after detach.
type duplexBody struct {
	rc     io.ReadCloser
	length int64 // Content-Length, or -1

	// gate holds a token while a Read runs or detach works; detached is
	// read and written only by its holder.
	gate     chan struct{}
	detached bool

	read atomic.Int64
	eof  atomic.Bool
}

func newDuplexBody(rc io.ReadCloser, length int64) *duplexBody {
	return &duplexBody{rc: rc, length: length, gate: make(chan struct{}, 1)}
}

func (b *duplexBody) Read(p []byte) (int, error) {
	b.gate <- struct{}{}
	defer func() { <-b.gate }()
	if b.detached {
		return 0, errBodyDetached
	}
	n, err := b.rc.Read(p)
	b.read.Add(int64(n))
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

// Close does nothing: the handler ends the body in detach. (ReverseProxy
// does not pass the transport's Close on either.)
func (b *duplexBody) Close() error { return nil }

// ended reports whether the body was read to its end: EOF seen, or all of
// its declared length read (what is left is the EOF itself, which a read
// gets without waiting for the client; a declared 0, which ReverseProxy
// does not read at all, is ended from the start).
func (b *duplexBody) ended() bool {
	return b.eof.Load() || (b.length >= 0 && b.read.Load() >= b.length)
}

// detach takes the body from the transport once the answer is done: it
// waits out a Read in progress (cutting it short when the body has not
// ended, since its client may send nothing more), makes every later Read
// fail, and reads an ended body's EOF here, in the handler.
func (b *duplexBody) detach(w http.ResponseWriter, r *http.Request) {
	if !b.ended() {
		// The answer said Connection: close; a past read deadline ends a
		// Read waiting for the client, and the server's own read of the
		// rest when it finishes the request.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	}
	select {
	case b.gate <- struct{}{}:
	case <-time.After(bodyWait):
		httpapi.Logger(r.Context()).WarnContext(r.Context(), "proxy: request body still being read after the answer")
		return
	}
	b.detached = true
	if b.ended() {
		// Reads the EOF (no wait) and so starts the server's read for the
		// next request while the handler runs, where the server expects it.
		_ = b.rc.Close()
	}
	<-b.gate
}
