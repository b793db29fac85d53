package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/compat/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/dsec-project/dsec/internal/compat/e2b/envdpb/process/processconnect"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// target is the sandbox an envd request is for, carried in its context to
// the Connect handlers.
type target struct {
	id        string // dsec id
	sb        *api.Sandbox
	user      string        // from Authorization: Basic user:
	timeout   time.Duration // Connect-Timeout-Ms; 0 = none
	keepalive time.Duration // Keepalive-Ping-Interval
}

type targetKey struct{}

func targetFrom(ctx context.Context) *target {
	t, _ := ctx.Value(targetKey{}).(*target)
	return t
}

// Defaults of envd's stream timing.
const (
	defaultKeepalive = 90 * time.Second
	minKeepalive     = time.Second
	// homeDir is where relative paths resolve (commands run as root).
	homeDir = "/root"
)

// newRPC mounts the Connect services.
func (h *Handler) newRPC() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{h: h}))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&fsService{h: h}))
	return mux
}

// sandboxGone is the answer of E2B's edge for a sandbox it cannot reach.
func sandboxGone(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway})
}

// serveEnvd serves an envd request for E2B sandbox id.
func (h *Handler) serveEnvd(w http.ResponseWriter, r *http.Request, id, port string) {
	if port != "" && port != envdPort {
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "port": port,
			"message": "dsec serves only envd (port " + envdPort + ") here; reach other ports through /v1/sandboxes/{id}/ports", "code": http.StatusBadGateway})
		return
	}
	if r.URL.Path == "/health" && r.Method == http.MethodGet && r.Header.Get("X-Access-Token") == "" {
		// An unauthenticated probe learns nothing about any sandbox.
		w.WriteHeader(http.StatusNoContent)
		return
	}
	tok := r.Header.Get("X-Access-Token")
	if tok == "" {
		writeJSON(w, http.StatusUnauthorized, apiError{Code: http.StatusUnauthorized, Message: "unauthorized access, please provide a valid access token (X-Access-Token)"})
		return
	}
	ctx, err := h.b.Authenticate(r.Context(), DsecKey(tok))
	if err != nil {
		writeJSON(w, http.StatusUnauthorized, apiError{Code: http.StatusUnauthorized, Message: err.Error()})
		return
	}
	sb, err := h.b.Get(ctx, DsecID(id))
	if err != nil || sb.State != api.StateRunning {
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			h.cfg.Logger.WarnContext(ctx, "e2b: envd lookup", "sandbox", id, "err", err)
		}
		sandboxGone(w, id)
		return
	}
	t := &target{id: sb.ID, sb: sb, keepalive: defaultKeepalive}
	if u, _, ok := r.BasicAuth(); ok {
		t.user = u
	}
	if v := r.Header.Get("Connect-Timeout-Ms"); v != "" {
		// Read here, not by connect-go: it is the lifetime of a started
		// process, not of the request, and "0" means none.
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"code": "invalid_argument", "message": "Connect-Timeout-Ms must be a non-negative integer"})
			return
		}
		t.timeout = time.Duration(ms) * time.Millisecond
		r.Header.Del("Connect-Timeout-Ms")
	}
	if v := r.Header.Get("Keepalive-Ping-Interval"); v != "" {
		if s, err := strconv.ParseInt(v, 10, 64); err == nil && s > 0 {
			t.keepalive = max(time.Duration(s)*time.Second, minKeepalive)
		}
	}
	r = r.WithContext(context.WithValue(ctx, targetKey{}, t))
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/process.Process/"), strings.HasPrefix(p, "/filesystem.Filesystem/"):
		h.rpc.ServeHTTP(w, r)
	case p == "/health":
		w.WriteHeader(http.StatusNoContent)
	case p == "/envs" && r.Method == http.MethodGet:
		env := sb.Env
		if env == nil {
			env = map[string]string{}
		}
		writeJSON(w, http.StatusOK, env)
	case p == "/metrics" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"ts": time.Now().Unix(), "cpu_count": max(1, int(sb.Resources.CPU+0.999)),
			"cpu_used_pct": 0, "mem_total": sb.Resources.MemoryMB << 20, "mem_used": 0, "disk_total": sb.Resources.DiskMB << 20, "disk_used": 0})
	case p == "/files" && r.Method == http.MethodGet:
		h.readFile(w, r, t)
	case p == "/files" && r.Method == http.MethodPost:
		h.writeFiles(w, r, t)
	case p == "/files" || p == "/envs" || p == "/metrics":
		writeJSON(w, http.StatusMethodNotAllowed, apiError{Code: http.StatusMethodNotAllowed, Message: "method " + r.Method + " not allowed on " + p})
	default:
		writeJSON(w, http.StatusNotFound, apiError{Code: http.StatusNotFound, Message: "no route " + r.Method + " " + p})
	}
}

// absPath resolves a path as envd does: relative to the home directory.
func absPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Invalid("path is required")
	case strings.ContainsRune(p, 0):
		return "", errdefs.Invalid("path contains a NUL byte")
	case strings.HasPrefix(p, "~/") || p == "~":
		p = homeDir + p[1:]
	case !strings.HasPrefix(p, "/"):
		p = homeDir + "/" + p
	}
	return path.Clean(p), nil
}

func (h *Handler) writeFileError(w http.ResponseWriter, r *http.Request, err error) {
	st := httpStatus(err)
	if errors.Is(err, errdefs.ErrResourceExhausted) || errors.Is(err, errdefs.ErrTooLarge) {
		st = http.StatusInsufficientStorage
	}
	msg := err.Error()
	if st == http.StatusInternalServerError {
		h.cfg.Logger.ErrorContext(r.Context(), "e2b: files", "path", r.URL.Query().Get("path"), "err", err)
		msg = "internal error"
	}
	writeJSON(w, st, apiError{Code: st, Message: msg})
}

// readFile is GET /files?path=: the file's bytes.
func (h *Handler) readFile(w http.ResponseWriter, r *http.Request, t *target) {
	p, err := absPath(r.URL.Query().Get("path"))
	if err != nil {
		h.writeFileError(w, r, err)
		return
	}
	resp, err := h.b.Agent(r.Context(), t.id, http.MethodGet, "/files", url.Values{"path": {p}}, nil)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = fmt.Errorf("path '%s' does not exist: %w", p, errdefs.ErrNotFound)
		}
		h.writeFileError(w, r, err)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	if cl := resp.Header.Get("Content-Length"); cl != "" {
		w.Header().Set("Content-Length", cl)
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, resp.Body)
}

// entryInfo is the answer of POST /files, one per file written.
type entryInfo struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// writeFiles is POST /files: multipart parts named "file" (the target
// path in the query, else in each part's filename), or a raw body.
func (h *Handler) writeFiles(w http.ResponseWriter, r *http.Request, t *target) {
	qpath := r.URL.Query().Get("path")
	put := func(p string, body io.Reader) error {
		p, err := absPath(p)
		if err != nil {
			return err
		}
		resp, err := h.b.Agent(r.Context(), t.id, http.MethodPut, "/files", url.Values{"path": {p}}, body)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	var out []entryInfo
	add := func(p string) {
		p, _ = absPath(p)
		out = append(out, entryInfo{Path: p, Name: path.Base(p), Type: "file"})
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "multipart/form-data" {
		if qpath == "" {
			h.writeFileError(w, r, errdefs.Invalid("a raw upload needs ?path="))
			return
		}
		var body io.Reader = r.Body
		if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
			zr, err := gzipReader(r.Body)
			if err != nil {
				h.writeFileError(w, r, errdefs.Invalid("body is not gzip: %v", err))
				return
			}
			body = zr
		}
		if err := put(qpath, body); err != nil {
			h.writeFileError(w, r, err)
			return
		}
		add(qpath)
		writeJSON(w, http.StatusOK, out)
		return
	}
	mr, err := r.MultipartReader()
	if err != nil {
		h.writeFileError(w, r, errdefs.Invalid("multipart body: %v", err))
		return
	}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			h.writeFileError(w, r, errdefs.Invalid("multipart body: %v", err))
			return
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		p := qpath
		if p == "" {
			// The raw filename: Part.FileName keeps only its base.
			_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			if err == nil {
				p = params["filename"]
			}
		}
		if p == "" {
			part.Close()
			h.writeFileError(w, r, errdefs.Invalid("a file part has no path: give ?path= or a filename"))
			return
		}
		err = put(p, part)
		part.Close()
		if err != nil {
			h.writeFileError(w, r, err)
			return
		}
		add(p)
	}
	if len(out) == 0 {
		h.writeFileError(w, r, errdefs.Invalid("no part named \"file\" in the body"))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// connectError turns an error into a Connect error of its class.
func connectError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, errdefs.ErrInvalid):
		code = connect.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, errdefs.ErrAlreadyExists):
		code = connect.CodeAlreadyExists
	case errors.Is(err, errdefs.ErrPermissionDenied):
		code = connect.CodePermissionDenied
	case errors.Is(err, errdefs.ErrUnauthenticated):
		code = connect.CodeUnauthenticated
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrResourceExhausted), errors.Is(err, errdefs.ErrTooLarge):
		code = connect.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrUnavailable):
		code = connect.CodeUnavailable
	}
	return connect.NewError(code, err)
}
