// Package swerex serves SWE-ReX's remote-runtime API (the HTTP server
// swerex-remote that SWE-agent's RemoteDeployment talks to) for one dsec
// sandbox per path prefix: /swerex/{id}/is_alive, /create_session,
// /run_in_session, /close_session, /execute, /read_file, /write_file,
// /upload and /close. SWE-ReX's RemoteRuntime pointed at
// host=http://HOST:PORT/swerex/{id} (port None) then drives a dsec sandbox
// unchanged.
//
// A session is a long-lived shell on a pseudo-terminal in the sandbox (the
// agent's terminal), driven as SWE-ReX's BashSession drives pexpect: PS1 is
// the marker SHELLPS1PREFIX, a command's output is what comes before the
// next prompt, its exit code is read with echo EXITCODESTART$?EXITCODEEND,
// a timeout leaves it running and an interrupt sends Ctrl-C. Errors are
// encoded as SWE-ReX's server encodes them: runtime exceptions as HTTP 511
// {"swerexception": {...}} naming the Python class the client re-raises,
// bad bodies as FastAPI's 422 {"detail": [...]}, others as {"detail": ...}.
// Answers are kept by X-Request-ID, so a client's retry gets the first
// answer and does not run the command twice.
package swerex

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Backend is what the surface needs of the control plane.
type Backend interface {
	// Authenticate checks an API key and returns a context that carries
	// its tenant, for the calls below.
	Authenticate(ctx context.Context, key string) (context.Context, error)
	// Sandbox returns a running sandbox of the caller's tenant; another
	// tenant's sandbox is not found.
	Sandbox(ctx context.Context, id string) (Box, error)
}

// Box is one sandbox.
type Box interface {
	Exec(ctx context.Context, req *api.ExecRequest) (*api.ExecResult, error)
	// WriteFile writes a file, creating its parent directories.
	WriteFile(ctx context.Context, path string, data []byte) error
	// ReadFile reads a regular file; a directory is an error of class
	// errdefs.ErrInvalid.
	ReadFile(ctx context.Context, path string) ([]byte, error)
	// Terminal starts argv on a pseudo-terminal with env added to its
	// environment. Reads return its output, writes are keystrokes; it
	// ends when closed, when the command exits or when the sandbox goes.
	Terminal(ctx context.Context, argv []string, env map[string]string) (io.ReadWriteCloser, error)
}

// Config configures the surface.
type Config struct {
	Logger *slog.Logger
	// MaxUpload bounds an /upload body (default 512 MiB).
	MaxUpload int64
}

// Handler serves the API; the caller strips the prefix up to and
// including /swerex, so paths are /{id}/{endpoint}.
type Handler struct {
	b   Backend
	cfg Config

	mu  sync.Mutex
	rts map[string]*runtime // by sandbox id
}

// New returns the handler.
func New(b Backend, cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxUpload <= 0 {
		cfg.MaxUpload = 512 << 20
	}
	return &Handler{b: b, cfg: cfg, rts: map[string]*runtime{}}
}

// Limits.
const (
	maxBody     = 64 << 20 // a JSON body (write_file's content)
	replaySlots = 32       // answers kept per sandbox for X-Request-ID
	// maxCall bounds a call that goes on after its client left (a command
	// without a timeout).
	maxCall = 24 * time.Hour
)

// runtime is the state of one sandbox's SWE-ReX runtime: its sessions and
// the answers kept for replay.
type runtime struct {
	mu       sync.Mutex
	sessions map[string]*session
	replay   []*reply // oldest first
}

// reply is an answer kept by request id; done is closed once it is set.
type reply struct {
	id, endpoint string
	done         chan struct{}
	status       int
	body         []byte
}

func (h *Handler) runtime(id string) *runtime {
	h.mu.Lock()
	defer h.mu.Unlock()
	rt := h.rts[id]
	if rt == nil {
		rt = &runtime{sessions: map[string]*session{}}
		h.rts[id] = rt
	}
	return rt
}

// forget drops what is left of a sandbox that was not found: sessions
// whose shell is gone, and the sandbox's state once none is left. The
// sandbox may only be another tenant's, so live sessions stay.
func (h *Handler) forget(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rt := h.rts[id]
	if rt == nil {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for name, s := range rt.sessions {
		if s != nil && s.ended() {
			delete(rt.sessions, name)
		}
	}
	if len(rt.sessions) == 0 {
		delete(h.rts, id)
	}
}

// Close ends every session (server shutdown).
func (h *Handler) Close() {
	h.mu.Lock()
	rts := h.rts
	h.rts = map[string]*runtime{}
	h.mu.Unlock()
	for _, rt := range rts {
		rt.closeAll()
	}
}

func (rt *runtime) closeAll() {
	rt.mu.Lock()
	ss := rt.sessions
	rt.sessions = map[string]*session{}
	rt.mu.Unlock()
	for _, s := range ss {
		s.close()
	}
}

// ServeHTTP routes /{id}/{endpoint}.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/")
	id, endpoint, _ := strings.Cut(rest, "/")
	ep, ok := endpoints[endpoint]
	switch {
	case id == "" || !ok:
		writeJSON(w, http.StatusNotFound, detail("Not Found"))
		return
	case r.Method != ep.method:
		writeJSON(w, http.StatusMethodNotAllowed, detail("Method Not Allowed"))
		return
	}
	key := strings.TrimSpace(r.Header.Get("X-API-Key"))
	if key == "" {
		// FastAPI's APIKeyHeader on a missing header.
		writeJSON(w, http.StatusForbidden, detail("Not authenticated"))
		return
	}
	ctx, err := h.b.Authenticate(r.Context(), key)
	if err != nil {
		writeJSON(w, http.StatusUnauthorized, detail("Invalid API Key"))
		return
	}
	box, err := h.b.Sandbox(ctx, id)
	if err != nil {
		if errdefs.Code(err) == api.CodeNotFound {
			h.forget(id)
		}
		writeJSON(w, statusOf(err), detail(err.Error()))
		return
	}
	rt := h.runtime(id)
	reqID := r.Header.Get("X-Request-ID")
	if reqID == "" {
		status, body := h.call(ctx, r, rt, box, endpoint, ep)
		writeRaw(w, status, body)
		return
	}
	rep, first := rt.claim(reqID, endpoint)
	if first {
		// A client retries when its connection failed: the call goes on
		// without it, so that the retry gets its answer instead of a
		// second run (as swerex-remote's handlers run to their end).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxCall)
		rep.status, rep.body = h.call(cctx, r, rt, box, endpoint, ep)
		cancel()
		close(rep.done)
	} else {
		select {
		case <-rep.done:
			h.cfg.Logger.DebugContext(ctx, "swerex: replayed", "sandbox", id, "endpoint", endpoint, "request_id", reqID)
		case <-ctx.Done():
			return // the client went while the first try was still running
		}
	}
	writeRaw(w, rep.status, rep.body)
}

// claim returns the reply kept for a request id, or a new one to fill
// (first) if there is none.
func (rt *runtime) claim(id, endpoint string) (*reply, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, r := range rt.replay {
		if r.id == id && r.endpoint == endpoint {
			return r, false
		}
	}
	r := &reply{id: id, endpoint: endpoint, done: make(chan struct{})}
	if len(rt.replay) >= replaySlots {
		rt.replay = rt.replay[1:]
	}
	rt.replay = append(rt.replay, r)
	return r, true
}

type endpoint struct {
	method string
	fn     func(h *Handler, ctx context.Context, r *http.Request, rt *runtime, box Box) (any, error)
}

var endpoints = map[string]endpoint{
	"": {http.MethodGet, func(*Handler, context.Context, *http.Request, *runtime, Box) (any, error) {
		return map[string]string{"message": "hello world"}, nil
	}},
	"is_alive":       {http.MethodGet, (*Handler).isAlive},
	"create_session": {http.MethodPost, (*Handler).createSession},
	"run_in_session": {http.MethodPost, (*Handler).runInSession},
	"close_session":  {http.MethodPost, (*Handler).closeSession},
	"execute":        {http.MethodPost, (*Handler).execute},
	"read_file":      {http.MethodPost, (*Handler).readFile},
	"write_file":     {http.MethodPost, (*Handler).writeFile},
	"upload":         {http.MethodPost, (*Handler).upload},
	"close":          {http.MethodPost, (*Handler).closeRuntime},
}

// call runs an endpoint and encodes its answer or error.
func (h *Handler) call(ctx context.Context, r *http.Request, rt *runtime, box Box, name string, ep endpoint) (int, []byte) {
	started := time.Now()
	out, err := ep.fn(h, ctx, r, rt, box)
	var status int
	var v any
	var pe *pyError
	var ve validationErrors
	switch {
	case err == nil:
		status, v = http.StatusOK, out
	case errors.As(err, &pe):
		status, v = 511, map[string]any{"swerexception": pe.transfer()}
	case errors.As(err, &ve):
		status, v = http.StatusUnprocessableEntity, map[string]any{"detail": ve}
	default:
		status, v = statusOf(err), detail(err.Error())
	}
	h.cfg.Logger.DebugContext(ctx, "swerex call", "endpoint", name, "status", status, "ms", time.Since(started).Milliseconds())
	b, _ := marshal(v)
	return status, b
}

func (h *Handler) isAlive(context.Context, *http.Request, *runtime, Box) (any, error) {
	return map[string]any{"is_alive": true, "message": ""}, nil
}

// statusOf is the HTTP status of a dsec error: its class's status, and a
// 503 for what is not the client's fault.
func statusOf(err error) int {
	code := errdefs.Code(err)
	if code == api.CodeInvalid {
		return http.StatusUnprocessableEntity
	}
	if st := api.HTTPStatus(code); st >= 400 && st < 500 {
		return st
	}
	return http.StatusServiceUnavailable
}

func detail(msg string) map[string]any { return map[string]any{"detail": msg} }

func marshal(v any) ([]byte, error) {
	var sb strings.Builder
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v)
	return []byte(strings.TrimSuffix(sb.String(), "\n")), err
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := marshal(v)
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
