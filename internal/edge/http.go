package edge

import (
	"crypto/subtle"
	"net/http"
	"net/http/httputil"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/reqid"
)

// Handler serves the edge HTTP API. With a non-empty token every request
// must carry it as a bearer token.
func (e *Edge) Handler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/node", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, e.Info())
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, e.List())
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req CreateRequest
		if err := httpapi.DecodeJSON(r, &req); err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		st, err := e.Create(r.Context(), req)
		if err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		httpapi.WriteJSON(w, http.StatusCreated, st)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		st, err := e.Get(r.Context(), r.PathValue("id"))
		if err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, st)
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := e.Destroy(r.Context(), r.PathValue("id")); err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/recycle", e.handleRecycle)
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshot", func(w http.ResponseWriter, r *http.Request) {
		var req SnapshotRequest
		if err := httpapi.DecodeJSON(r, &req); err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		res, err := e.Snapshot(r.Context(), r.PathValue("id"), req)
		if err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		httpapi.WriteJSON(w, http.StatusCreated, res)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		var req ForkRequest
		if err := httpapi.DecodeJSON(r, &req); err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		res, err := e.Fork(r.Context(), r.PathValue("id"), req)
		if err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		httpapi.WriteJSON(w, http.StatusCreated, res)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/{op}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		var err error
		switch r.PathValue("op") {
		case "reset":
			err = e.Reset(r.Context(), id)
		case "pause":
			err = e.Pause(r.Context(), id)
		case "resume":
			err = e.Resume(r.Context(), id)
		case "hibernate":
			err = e.Hibernate(r.Context(), id)
		default:
			err = errdefs.NotFound("operation %q", r.PathValue("op"))
		}
		if err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("PUT /v1/sandboxes/{id}/phase", func(w http.ResponseWriter, r *http.Request) {
		var req PhaseRequest
		if err := httpapi.DecodeJSON(r, &req); err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		if err := e.SetPhase(r.Context(), r.PathValue("id"), req); err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/v1/sandboxes/{id}/agent/{rest...}", e.proxyAgent)
	e.displayRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, r, errdefs.NotFound("no route %s %s", r.Method, r.URL.Path))
	})
	var h http.Handler = mux
	if token == "" {
		return e.withRequest(h)
	}
	want := []byte("Bearer " + token)
	return e.withRequest(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			httpapi.WriteError(w, r, errdefs.ErrUnauthenticated)
			return
		}
		mux.ServeHTTP(w, r)
	}))
}

// withRequest gives each request its id (package reqid) and the edge's
// logger for its errors, and logs it at debug level.
func (e *Edge) withRequest(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		r = reqid.Request(w, r)
		r = r.WithContext(httpapi.WithLogger(r.Context(), e.log))
		defer func() {
			e.log.DebugContext(r.Context(), "request", "method", r.Method, "path", r.URL.Path, "duration", time.Since(start))
		}()
		h.ServeHTTP(w, r)
	})
}

// agentFlush is how proxies to an agent flush: 0, not -1. An answer of
// unknown length (an NDJSON exec stream, a chunked download) is flushed
// as it comes whatever FlushInterval says (ReverseProxy flushes those at
// once). One of known length (a buffered exec's result, which the agent
// sends whole) is written as it is copied, in one write: with -1,
// ReverseProxy flushes its header at once, from a timer goroutine, and
// the body after, so the caller woke twice for every exec.
const agentFlush = 0

// proxyAgent forwards a request to the sandbox's agent, streaming both
// ways: exec (JSON or NDJSON), files and background processes.
func (e *Edge) proxyAgent(w http.ResponseWriter, r *http.Request) {
	ag, err := e.Agent(r.PathValue("id"))
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	rest := "/" + strings.TrimPrefix(r.PathValue("rest"), "/")
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "agent"
			pr.Out.URL.Path = rest
			pr.Out.URL.RawPath = ""
			pr.Out.Host = "agent"
		},
		Transport:     ag.Transport(),
		FlushInterval: agentFlush,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			httpapi.WriteJSON(w, http.StatusServiceUnavailable, api.ErrorResponse{Error: &api.Error{
				Code: api.CodeUnavailable, Message: "sandbox agent unreachable: " + err.Error(),
			}})
		},
	}
	serveDuplex(rp, w, r)
}
