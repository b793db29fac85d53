// Package fusion serves SandboxFusion's code-execution API — POST
// /run_code and GET /v1/ping — as verl's reward and tool code calls it, so
// that a verl job pointed at dsec runs unchanged. Each call leases a clean
// sandbox of a FnCall warm pool (through Backend), writes the request's
// files and source, compiles and runs with SandboxFusion's timeouts, reads
// back fetch_files and hands the sandbox back to be reset.
//
// Answers follow SandboxFusion byte for byte where verl reads them: status
// strings, CommandRunResult fields, HTTP 200 for programs that failed, 422
// {"detail": [...]} for a body pydantic would refuse. It must never answer
// a 500 for bad input, nor run two calls in one sandbox without a reset in
// between.
package fusion

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Backend is what the surface needs of the control plane.
type Backend interface {
	// Authenticate checks an API key and returns a context that carries
	// its tenant, for the calls below.
	Authenticate(ctx context.Context, key string) (context.Context, error)
	// Lease takes a clean sandbox of the layers and resources for one call.
	Lease(ctx context.Context, layers api.LayerRefs, res api.Resources) (Box, error)
}

// Box is one leased sandbox.
type Box interface {
	Exec(ctx context.Context, req *api.ExecRequest) (*api.ExecResult, error)
	WriteFile(ctx context.Context, path string, data []byte) error
	ReadFile(ctx context.Context, path string) ([]byte, error)
	// Release hands the sandbox back; clean is false when it may be
	// broken (it is then destroyed rather than reset).
	Release(clean bool)
}

// Config configures the surface.
type Config struct {
	// Layers is the layer stack of the sandboxes calls run in: a base
	// with the toolchains (make sandboxfusion-base).
	Layers api.LayerRefs
	// Resources of those sandboxes; a call's memory_limit_MB replaces
	// MemoryMB.
	Resources api.Resources
	Logger    *slog.Logger
}

// Handler serves the API under its mount point (the caller strips the
// prefix).
type Handler struct {
	b   Backend
	cfg Config
}

// New returns the handler.
func New(b Backend, cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Handler{b: b, cfg: cfg}
}

// Limits of a request.
const (
	maxBody       = 64 << 20
	maxOutput     = 1 << 20 // SandboxFusion reads at most 1 MiB of each stream
	maxTimeout    = 600.0   // seconds, compile or run
	workDir       = "/tmp/sandboxfusion"
	keyPathPrefix = "dsec_"
)

// RunCodeRequest is SandboxFusion's RunCodeRequest.
type RunCodeRequest struct {
	Code           string             `json:"code"`
	Language       string             `json:"language"`
	CompileTimeout *float64           `json:"compile_timeout"`
	RunTimeout     *float64           `json:"run_timeout"`
	MemoryLimitMB  *int64             `json:"memory_limit_MB"`
	Stdin          *string            `json:"stdin"`
	Files          map[string]*string `json:"files"`
	FetchFiles     []string           `json:"fetch_files"`
}

// CommandRunResult is the result of a compile or run step.
type CommandRunResult struct {
	Status        string   `json:"status"` // Finished, Error, TimeLimitExceeded
	ExecutionTime *float64 `json:"execution_time"`
	ReturnCode    *int     `json:"return_code"`
	Stdout        *string  `json:"stdout"`
	Stderr        *string  `json:"stderr"`
}

// RunCodeResponse is SandboxFusion's RunCodeResponse.
type RunCodeResponse struct {
	Status          string            `json:"status"` // Success, Failed, SandboxError
	Message         string            `json:"message"`
	CompileResult   *CommandRunResult `json:"compile_result"`
	RunResult       *CommandRunResult `json:"run_result"`
	ExecutorPodName *string           `json:"executor_pod_name"`
	Files           map[string]string `json:"files"`
}

// Step statuses and call statuses, as SandboxFusion spells them.
const (
	StepFinished     = "Finished"
	StepError        = "Error"
	StepTimeLimit    = "TimeLimitExceeded"
	CallSuccess      = "Success"
	CallFailed       = "Failed"
	CallSandboxError = "SandboxError"
)

// ServeHTTP routes /run_code and /v1/ping. The key comes from
// Authorization: Bearer, X-API-Key, or a first path segment dsec_…
// (for clients, like verl, that can only be given a URL).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	key := ""
	if rest, ok := strings.CutPrefix(p, "/"); ok {
		if seg, tail, ok := strings.Cut(rest, "/"); ok && strings.HasPrefix(seg, keyPathPrefix) {
			key, p = seg, "/"+tail
		}
	}
	if key == "" {
		key = bearer(r)
	}
	switch {
	case p == "/v1/ping" && r.Method == http.MethodGet:
		// Health probes carry no key; pong says nothing about anyone.
		writeJSON(w, http.StatusOK, "pong")
		return
	case p == "/run_code" && r.Method == http.MethodPost:
	case p == "/run_code" || p == "/v1/ping":
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
		return
	default:
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	}
	if key == "" {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "missing API key: Authorization: Bearer <key>, X-API-Key, or …/<key>/run_code"})
		return
	}
	ctx, err := h.b.Authenticate(r.Context(), key)
	if err != nil {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": err.Error()})
		return
	}
	req, detail := decode(r)
	if detail != nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": detail})
		return
	}
	resp, status := h.run(ctx, req)
	writeJSON(w, status, resp)
}

func bearer(r *http.Request) string {
	if k, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(k)
	}
	return strings.TrimSpace(r.Header.Get("X-API-Key"))
}

// validationError is one item of FastAPI's 422 detail list.
type validationError struct {
	Type string   `json:"type"`
	Loc  []string `json:"loc"`
	Msg  string   `json:"msg"`
}

func invalid(field, msg string) []validationError {
	return []validationError{{Type: "value_error", Loc: []string{"body", field}, Msg: msg}}
}

// decode reads and checks a RunCodeRequest the way SandboxFusion's
// pydantic model does: unknown fields ignored, defaults filled.
func decode(r *http.Request) (*RunCodeRequest, []validationError) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return nil, invalid("", "read body: "+err.Error())
	}
	if len(body) > maxBody {
		return nil, invalid("", fmt.Sprintf("body is over %d bytes", maxBody))
	}
	var req RunCodeRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, []validationError{{Type: "json_invalid", Loc: []string{"body"}, Msg: "JSON decode error: " + err.Error()}}
	}
	if req.Code == "" && !strings.Contains(string(body), `"code"`) {
		return nil, []validationError{{Type: "missing", Loc: []string{"body", "code"}, Msg: "Field required"}}
	}
	if req.Language == "" {
		return nil, []validationError{{Type: "missing", Loc: []string{"body", "language"}, Msg: "Field required"}}
	}
	if !knownLanguage(req.Language) {
		return nil, []validationError{{Type: "enum", Loc: []string{"body", "language"},
			Msg: fmt.Sprintf("Input should be one of %s", strings.Join(sfLanguages, ", "))}}
	}
	for _, t := range []struct {
		name string
		v    *float64
	}{{"compile_timeout", req.CompileTimeout}, {"run_timeout", req.RunTimeout}} {
		if t.v != nil && (*t.v < 0 || *t.v > maxTimeout || math.IsNaN(*t.v)) {
			return nil, invalid(t.name, fmt.Sprintf("must be between 0 and %g seconds", maxTimeout))
		}
	}
	if req.MemoryLimitMB != nil && *req.MemoryLimitMB > 1<<20 {
		return nil, invalid("memory_limit_MB", "over 1 TiB")
	}
	for name, b64 := range req.Files {
		if badPath(name) {
			return nil, invalid("files", fmt.Sprintf("file name %q is empty or has a NUL byte", name))
		}
		if b64 != nil {
			if _, err := base64.StdEncoding.DecodeString(*b64); err != nil {
				return nil, invalid("files", fmt.Sprintf("files[%q] is not base64: %v", name, err))
			}
		}
	}
	for _, name := range req.FetchFiles {
		if badPath(name) {
			return nil, invalid("fetch_files", fmt.Sprintf("file name %q is empty or has a NUL byte", name))
		}
	}
	return &req, nil
}

func badPath(p string) bool { return p == "" || strings.IndexByte(p, 0) >= 0 }

// resolve places a request path in the work directory, as SandboxFusion
// restores files relative to its temp dir (absolute paths stay absolute).
func resolve(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(workDir, p)
}

func seconds(v *float64, def float64) time.Duration {
	if v == nil {
		return time.Duration(def * float64(time.Second))
	}
	return time.Duration(*v * float64(time.Second))
}

// run does one call. The HTTP status is 200 for every program outcome;
// 504 when no sandbox could be had in time (verl retries on 504 only).
func (h *Handler) run(ctx context.Context, req *RunCodeRequest) (*RunCodeResponse, int) {
	resp := &RunCodeResponse{Files: map[string]string{}}
	lang, ok := languages[req.Language]
	if !ok {
		resp.Status, resp.Message = CallSandboxError, fmt.Sprintf("language %s is not supported by this server", req.Language)
		return resp, http.StatusOK
	}
	res := h.cfg.Resources
	if req.MemoryLimitMB != nil && *req.MemoryLimitMB > 0 {
		res.MemoryMB = max(*req.MemoryLimitMB, 16)
	}
	compileTimeout, runTimeout := seconds(req.CompileTimeout, 10), seconds(req.RunTimeout, 10)
	// The wait for a free sandbox is bounded like the call itself.
	lctx, cancel := context.WithTimeout(ctx, compileTimeout+runTimeout+30*time.Second)
	box, err := h.b.Lease(lctx, h.cfg.Layers, res)
	cancel()
	if err != nil {
		if code := errdefs.Code(err); errors.Is(err, context.DeadlineExceeded) || code == api.CodeUnavailable ||
			code == api.CodeDeadlineExceeded {
			resp.Status, resp.Message = CallSandboxError, "no sandbox available: "+err.Error()
			return resp, http.StatusGatewayTimeout
		}
		resp.Status, resp.Message = CallSandboxError, err.Error()
		return resp, statusOf(err)
	}
	clean := true
	defer func() { box.Release(clean) }()
	if err := h.prepare(ctx, box, req, lang); err != nil {
		resp.Status, resp.Message = CallSandboxError, err.Error()
		clean = false
		return resp, http.StatusOK
	}
	if lang.compile != nil {
		resp.CompileResult = h.step(ctx, box, lang.compile, nil, compileTimeout)
		if r := resp.CompileResult; r.Status != StepFinished || *r.ReturnCode != 0 {
			resp.Status, resp.Message = parseStatus(resp)
			return resp, http.StatusOK
		}
	}
	resp.RunResult = h.step(ctx, box, lang.run, req.Stdin, runTimeout)
	for _, f := range req.FetchFiles {
		data, err := box.ReadFile(ctx, resolve(f))
		if err != nil {
			h.cfg.Logger.DebugContext(ctx, "run_code: fetch file", "path", f, "err", err)
			continue // SandboxFusion leaves out files it cannot read
		}
		resp.Files[f] = base64.StdEncoding.EncodeToString(data)
	}
	resp.Status, resp.Message = parseStatus(resp)
	return resp, http.StatusOK
}

// prepare writes the request's files and the source into the work dir.
func (h *Handler) prepare(ctx context.Context, box Box, req *RunCodeRequest, lang language) error {
	for name, b64 := range req.Files {
		// SandboxFusion skips null values and its own placeholder names.
		if b64 == nil || strings.Contains(name, "IGNORE_THIS_FILE") {
			continue
		}
		data, err := base64.StdEncoding.DecodeString(*b64)
		if err != nil {
			return fmt.Errorf("files[%q] is not base64: %v", name, err)
		}
		if err := box.WriteFile(ctx, resolve(name), data); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	if err := box.WriteFile(ctx, path.Join(workDir, lang.file), []byte(req.Code)); err != nil {
		return fmt.Errorf("write source: %w", err)
	}
	return nil
}

// step runs one command in the work dir and reports it as SandboxFusion
// does: a timeout leaves return_code null, a failure of dsec is Error.
func (h *Handler) step(ctx context.Context, box Box, argv []string, stdin *string, timeout time.Duration) *CommandRunResult {
	req := &api.ExecRequest{Cmd: argv, Cwd: workDir, TimeoutMs: max(timeout.Milliseconds(), 1), MaxOutputBytes: maxOutput,
		Env: map[string]string{"HOME": workDir}}
	if stdin != nil {
		req.Stdin = *stdin
	}
	started := time.Now()
	res, err := box.Exec(ctx, req)
	if err != nil {
		msg := err.Error()
		return &CommandRunResult{Status: StepError, Stderr: &msg, Stdout: ptr("")}
	}
	elapsed := time.Since(started).Seconds()
	if res.DurationMs > 0 {
		elapsed = float64(res.DurationMs) / 1000
	}
	out, errOut := text(res.Stdout, res.Encoding), text(res.Stderr, res.Encoding)
	r := &CommandRunResult{Status: StepFinished, ExecutionTime: &elapsed, Stdout: &out, Stderr: &errOut}
	if res.TimedOut {
		r.Status = StepTimeLimit
		return r
	}
	rc := res.ExitCode
	if n, ok := signals[res.Signal]; ok {
		rc = -n // Python's returncode for a process killed by a signal
	}
	r.ReturnCode = &rc
	return r
}

var signals = map[string]int{"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6,
	"SIGBUS": 7, "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12, "SIGPIPE": 13,
	"SIGALRM": 14, "SIGTERM": 15, "SIGXCPU": 24, "SIGXFSZ": 25}

func text(s, enc string) string {
	if enc != api.EncodingBase64 {
		return s
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return s
	}
	return strings.ToValidUTF8(string(b), string(utf8.RuneError))
}

// parseStatus is SandboxFusion's parse_run_status.
func parseStatus(resp *RunCodeResponse) (string, string) {
	steps := []*CommandRunResult{resp.CompileResult, resp.RunResult}
	for _, s := range steps {
		if s != nil && s.Status == StepError {
			msg := ""
			if s.Stderr != nil {
				msg = *s.Stderr
			}
			return CallSandboxError, msg
		}
	}
	for _, s := range steps {
		if s != nil && (s.Status == StepTimeLimit || (s.ReturnCode != nil && *s.ReturnCode != 0)) {
			return CallFailed, ""
		}
	}
	return CallSuccess, ""
}

// statusOf is the HTTP status of a dsec error outside a program's run:
// bad input stays a 4xx, in FastAPI's 422 for what pydantic would refuse.
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

func ptr[T any](v T) *T { return &v }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // as Python's json writes < > &
	_ = enc.Encode(v)
}
