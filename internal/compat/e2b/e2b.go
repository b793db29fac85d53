// Package e2b serves E2B's API — the control plane (/sandboxes,
// /v2/sandboxes) and the in-sandbox service "envd" (Connect RPC
// process.Process and filesystem.Filesystem, REST /files, /health, /envs) —
// on the same listen address as /v1, so the unmodified E2B SDKs drive dsec
// sandboxes once E2B_API_URL and E2B_SANDBOX_URL point at dsec.
//
// Dispatch (Wrap): a request with an E2b-Sandbox-Id header, or a Host of the
// form PORT-ID.DOMAIN, is an envd request for that sandbox; a request for
// /sandboxes… or /v2/sandboxes… without one is a control-plane request;
// everything else (all of /v1) goes to the next handler.
//
// Keys: X-API-Key carries a dsec key, either as is or as e2b_<hex of the
// key> (the shape E2B's SDK source checks keys against). The envd access
// token handed to the SDK is the key itself, so every envd call is
// authenticated as its tenant and reaches only that tenant's sandboxes.
//
// Ids: E2B ids are [a-z0-9]+, dsec's are sb-<base32>; the E2B id is the
// dsec id without its '-', and the same sandbox is reachable through /v1.
package e2b

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Backend is what the surface needs of the control plane. Every call acts
// for the principal in its context (from Authenticate), exactly as the /v1
// handlers do.
type Backend interface {
	// Authenticate checks a dsec API key and returns a context that
	// carries its tenant.
	Authenticate(ctx context.Context, key string) (context.Context, error)
	Create(ctx context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error)
	Get(ctx context.Context, id string) (*api.Sandbox, error)
	// List lists the tenant's live sandboxes with all the labels given,
	// a page at a time.
	List(ctx context.Context, labels map[string]string, pageToken string, limit int) ([]api.Sandbox, string, error)
	Delete(ctx context.Context, id string) error
	// Renew moves the lease's end to now + ttl.
	Renew(ctx context.Context, id string, ttl time.Duration) (*api.Sandbox, error)
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Agent sends a request to the agent of a running sandbox (its
	// /exec, /procs, /files API) and returns the successful response;
	// an error answer comes back as an error of its class.
	Agent(ctx context.Context, id, method, path string, q url.Values, body io.Reader) (*http.Response, error)
}

// Config configures the surface.
type Config struct {
	// Templates maps E2B template ids to dsec layer stacks. A template
	// not in it is taken as a dsec base layer ref.
	Templates map[string]api.LayerRefs
	// Resources of the sandboxes it creates (zero: the server's defaults).
	Resources api.Resources
	// Domain is the sandbox domain returned to the SDK (for getHost); ""
	// leaves the SDK's own.
	Domain string
	Logger *slog.Logger
}

// Handler serves both planes.
type Handler struct {
	b        Backend
	cfg      Config
	watchers *watchers
	procs    *procConfigs
	rpc      *http.ServeMux
}

// New returns the handler.
func New(b Backend, cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &Handler{b: b, cfg: cfg, watchers: newWatchers(), procs: newProcConfigs()}
	h.rpc = h.newRPC()
	return h
}

// Wire constants.
const (
	// EnvdVersion is what the SDK branches on (COMPAT.md §1.7): process
	// and filesystem RPCs, CloseStdin, octet-stream uploads.
	EnvdVersion = "0.5.7"
	envdPort    = "49983"
	// DefaultTimeout is E2B's sandbox timeout when the create omits it.
	DefaultTimeout = 300
	maxTimeout     = 24 * 3600
	maxBody        = 1 << 20
	keyPrefix      = "e2b_"
	// LabelTemplate records the template a sandbox was created from.
	LabelTemplate = "e2b.dev/template"
)

// hostRE is E2B's sandbox host: PORT-ID.DOMAIN.
var hostRE = regexp.MustCompile(`^([0-9]{1,5})-([a-z0-9]+)\.`)

// Match reports whether a request is E2B's: an envd request (an
// E2b-Sandbox-Id header or a PORT-ID.DOMAIN host) or one for the control
// plane's /sandboxes… and /v2/sandboxes….
func Match(r *http.Request) bool {
	if r.Header.Get("E2b-Sandbox-Id") != "" || hostRE.MatchString(r.Host) {
		return true
	}
	p := r.URL.Path
	return p == "/sandboxes" || strings.HasPrefix(p, "/sandboxes/") || p == "/v2/sandboxes" || strings.HasPrefix(p, "/v2/sandboxes/")
}

// ServeHTTP serves a request Match accepted.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		h.serveEnvd(w, r, id, r.Header.Get("E2b-Sandbox-Port"))
		return
	}
	if m := hostRE.FindStringSubmatch(r.Host); m != nil {
		h.serveEnvd(w, r, m[2], m[1])
		return
	}
	h.serveControl(w, r)
}

// Wrap returns a handler that sends E2B's requests to h and the others to
// next.
func (h *Handler) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if Match(r) {
			h.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// DsecID is the dsec id of an E2B sandbox id.
func DsecID(e2bID string) string {
	if rest, ok := strings.CutPrefix(e2bID, "sb"); ok && rest != "" && !strings.Contains(rest, "-") {
		return "sb-" + rest
	}
	return e2bID
}

// E2BID is the E2B id of a dsec sandbox id.
func E2BID(dsecID string) string { return strings.Replace(dsecID, "-", "", 1) }

// DsecKey is the dsec key an X-API-Key carries: e2b_<hex> decoded, or the
// value as is.
func DsecKey(v string) string {
	v = strings.TrimSpace(v)
	if rest, ok := strings.CutPrefix(v, keyPrefix); ok {
		if b, err := hex.DecodeString(rest); err == nil && len(b) > 0 {
			return string(b)
		}
	}
	return v
}

// E2BKey is a dsec key in the shape E2B's SDK checks: e2b_<hex>.
func E2BKey(dsecKey string) string { return keyPrefix + hex.EncodeToString([]byte(dsecKey)) }

// apiError is E2B's control-plane and /files error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// httpStatus is the HTTP status of an error's class.
func httpStatus(err error) int {
	if errors.Is(err, context.Canceled) {
		return 499
	}
	return api.HTTPStatus(errdefs.Code(err))
}

// writeError writes err in E2B's format with the status of its class;
// internal errors are logged and not detailed.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	st := httpStatus(err)
	msg := err.Error()
	if st >= 500 && st != http.StatusServiceUnavailable && st != http.StatusGatewayTimeout {
		h.cfg.Logger.ErrorContext(r.Context(), "e2b: internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error"
	}
	writeJSON(w, st, apiError{Code: st, Message: msg})
}

func (h *Handler) authenticate(r *http.Request) (context.Context, error) {
	key := r.Header.Get("X-API-Key")
	if key == "" {
		if k, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			key = k
		}
	}
	if strings.TrimSpace(key) == "" {
		return nil, fmt.Errorf("missing API key (X-API-Key): %w", errdefs.ErrUnauthenticated)
	}
	return h.b.Authenticate(r.Context(), DsecKey(key))
}

// newSandbox is E2B's NewSandbox and NewSandboxV2 (the fields dsec reads;
// others are accepted and ignored).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AutoPause           *bool             `json:"autoPause"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
}

// sandboxJSON is E2B's Sandbox (create and connect answers).
type sandboxJSON struct {
	TemplateID      string  `json:"templateID"`
	SandboxID       string  `json:"sandboxID"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken"`
	Domain          *string `json:"domain"`
	Alias           string  `json:"alias,omitempty"`
}

// listedSandbox is E2B's ListedSandbox; detail adds SandboxDetail's fields.
type listedSandbox struct {
	TemplateID  string            `json:"templateID"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	Alias       string            `json:"alias,omitempty"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata,omitempty"`
}

type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken     string    `json:"envdAccessToken"`
	Domain              *string   `json:"domain"`
	AllowInternetAccess bool      `json:"allowInternetAccess"`
	Lifecycle           lifecycle `json:"lifecycle"`
}

type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

func (h *Handler) domain() *string {
	if h.cfg.Domain == "" {
		return nil
	}
	d := h.cfg.Domain
	return &d
}

func templateOf(sb *api.Sandbox) string {
	if t := sb.Labels[LabelTemplate]; t != "" {
		return t
	}
	return sb.Layers.Base
}

func (h *Handler) sandboxJSON(sb *api.Sandbox, token string) sandboxJSON {
	return sandboxJSON{TemplateID: templateOf(sb), SandboxID: E2BID(sb.ID), ClientID: "dsec",
		EnvdVersion: EnvdVersion, EnvdAccessToken: token, Domain: h.domain()}
}

func listed(sb *api.Sandbox) listedSandbox {
	state := "running"
	if sb.State == api.StatePaused {
		state = "paused"
	}
	md := map[string]string{}
	for k, v := range sb.Labels {
		if k != LabelTemplate {
			md[k] = v
		}
	}
	end := sb.CreatedAt
	if sb.ExpiresAt != nil {
		end = *sb.ExpiresAt
	}
	return listedSandbox{TemplateID: templateOf(sb), SandboxID: E2BID(sb.ID), ClientID: "dsec",
		StartedAt: sb.CreatedAt, EndAt: end, CPUCount: max(1, int(math.Ceil(sb.Resources.CPU))),
		MemoryMB: sb.Resources.MemoryMB, DiskSizeMB: sb.Resources.DiskMB, State: state,
		EnvdVersion: EnvdVersion, Metadata: md}
}

// serveControl routes the control plane.
func (h *Handler) serveControl(w http.ResponseWriter, r *http.Request) {
	ctx, err := h.authenticate(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	r = r.WithContext(ctx)
	p := strings.TrimPrefix(r.URL.Path, "/v2")
	parts := strings.Split(strings.Trim(p, "/"), "/")
	switch {
	case len(parts) == 1 && r.Method == http.MethodPost:
		err = h.create(w, r)
	case len(parts) == 1 && r.Method == http.MethodGet:
		err = h.list(w, r)
	case len(parts) == 2 && r.Method == http.MethodGet:
		err = h.get(w, r, parts[1])
	case len(parts) == 2 && r.Method == http.MethodDelete:
		err = h.kill(w, r, parts[1])
	case len(parts) == 3 && r.Method == http.MethodPost:
		switch parts[2] {
		case "timeout":
			err = h.setTimeout(w, r, parts[1])
		case "connect", "resume":
			err = h.connect(w, r, parts[1], parts[2] == "resume")
		case "pause":
			err = h.pause(w, r, parts[1])
		case "refreshes":
			err = h.refresh(w, r, parts[1])
		default:
			err = errdefs.NotFound("no route %s %s", r.Method, r.URL.Path)
		}
	case len(parts) <= 3:
		writeJSON(w, http.StatusMethodNotAllowed, apiError{Code: http.StatusMethodNotAllowed, Message: "method " + r.Method + " not allowed on " + r.URL.Path})
		return
	default:
		err = errdefs.NotFound("no route %s %s", r.Method, r.URL.Path)
	}
	if err != nil {
		h.writeError(w, r, err)
	}
}

// decodeBody reads an optional JSON body; unknown fields are ignored, as
// E2B's server does.
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return errdefs.Invalid("read body: %v", err)
	}
	if len(b) > maxBody {
		return fmt.Errorf("body over %d bytes: %w", maxBody, errdefs.ErrTooLarge)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errdefs.Invalid("malformed JSON body: %v", err)
	}
	return nil
}

func checkTimeout(t *int64) (time.Duration, error) {
	if t == nil {
		return DefaultTimeout * time.Second, nil
	}
	if *t < 0 || *t > maxTimeout {
		return 0, errdefs.Invalid("timeout must be between 0 and %d seconds", maxTimeout)
	}
	if *t == 0 {
		return DefaultTimeout * time.Second, nil
	}
	return time.Duration(*t) * time.Second, nil
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) error {
	var req newSandbox
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.TemplateID == "" {
		return errdefs.Invalid("templateID is required")
	}
	ttl, err := checkTimeout(req.Timeout)
	if err != nil {
		return err
	}
	layers, ok := h.cfg.Templates[req.TemplateID]
	if !ok {
		layers = api.LayerRefs{Base: req.TemplateID}
	}
	labels := map[string]string{LabelTemplate: req.TemplateID}
	for k, v := range req.Metadata {
		if k == LabelTemplate {
			return errdefs.Invalid("metadata key %q is reserved", k)
		}
		labels[k] = v
	}
	creq := &api.CreateSandboxRequest{Layers: &layers, Resources: h.cfg.Resources, Labels: labels,
		Env: req.EnvVars, TTLSeconds: int64(ttl / time.Second)}
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
		creq.Network = &api.Network{Mode: "none"}
	}
	sb, err := h.b.Create(r.Context(), creq)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, h.sandboxJSON(sb, tokenOf(r)))
	return nil
}

// tokenOf is the envd access token for the caller: its key as it sent it.
func tokenOf(r *http.Request) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return strings.TrimSpace(k)
	}
	k, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return strings.TrimSpace(k)
}

// live loads a sandbox E2B can see: deleted and failed ones are not found.
func (h *Handler) live(ctx context.Context, e2bID string) (*api.Sandbox, error) {
	sb, err := h.b.Get(ctx, DsecID(e2bID))
	if err != nil {
		return nil, err
	}
	switch sb.State {
	case api.StateDeleted, api.StateFailed:
		return nil, errdefs.NotFound("sandbox %s", e2bID)
	}
	return sb, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, id string) error {
	sb, err := h.live(r.Context(), id)
	if err != nil {
		return err
	}
	d := sandboxDetail{listedSandbox: listed(sb), EnvdAccessToken: tokenOf(r), Domain: h.domain(),
		AllowInternetAccess: sb.Network.Mode != "none", Lifecycle: lifecycle{OnTimeout: "kill"}}
	writeJSON(w, http.StatusOK, d)
	return nil
}

const maxPage = 1000

func (h *Handler) list(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPage {
			return errdefs.Invalid("limit must be 1..%d", maxPage)
		}
		limit = n
	}
	var labels map[string]string
	if v := q.Get("metadata"); v != "" {
		mq, err := url.ParseQuery(v)
		if err != nil {
			return errdefs.Invalid("metadata filter %q: want url-encoded key=value pairs", v)
		}
		labels = map[string]string{}
		for k, vs := range mq {
			labels[k] = vs[len(vs)-1]
		}
	}
	states := map[string]bool{"running": true, "paused": true}
	if v := q.Get("state"); v != "" {
		states = map[string]bool{}
		for s := range strings.SplitSeq(v, ",") {
			if s != "running" && s != "paused" {
				return errdefs.Invalid("state %q is not running or paused", s)
			}
			states[s] = true
		}
	}
	list, next, err := h.b.List(r.Context(), labels, q.Get("nextToken"), limit)
	if err != nil {
		return err
	}
	out := make([]listedSandbox, 0, len(list))
	for i := range list {
		sb := &list[i]
		if sb.State != api.StateRunning && sb.State != api.StatePaused {
			continue
		}
		l := listed(sb)
		if !states[l.State] {
			continue
		}
		out = append(out, l)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].StartedAt.After(out[j].StartedAt) })
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request, id string) error {
	if _, err := h.live(r.Context(), id); err != nil {
		return err
	}
	if err := h.b.Delete(r.Context(), DsecID(id)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, id string) error {
	var req timeoutBody
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Timeout == nil {
		return errdefs.Invalid("timeout is required")
	}
	ttl, err := checkTimeout(req.Timeout)
	if err != nil {
		return err
	}
	if _, err := h.live(r.Context(), id); err != nil {
		return err
	}
	if _, err := h.b.Renew(r.Context(), DsecID(id), ttl); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// refresh is POST /sandboxes/{id}/refreshes {"duration": s}.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request, id string) error {
	var req struct {
		Duration *int64 `json:"duration"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	ttl, err := checkTimeout(req.Duration)
	if err != nil {
		return err
	}
	if _, err := h.live(r.Context(), id); err != nil {
		return err
	}
	if _, err := h.b.Renew(r.Context(), DsecID(id), ttl); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect answers 200 with a running sandbox, or resumes a paused one and
// answers 201; either way its lease is extended to the timeout asked (300
// s when omitted).
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, id string, resumeOnly bool) error {
	var req timeoutBody
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	ttl, err := checkTimeout(req.Timeout)
	if err != nil {
		return err
	}
	sb, err := h.live(r.Context(), id)
	if err != nil {
		return err
	}
	status := http.StatusOK
	switch {
	case sb.State == api.StatePaused:
		if err := h.b.Resume(r.Context(), sb.ID); err != nil {
			return err
		}
		status = http.StatusCreated
	case resumeOnly:
		return fmt.Errorf("sandbox %s is already running: %w", id, errdefs.ErrAlreadyExists)
	}
	sb, err = h.b.Renew(r.Context(), sb.ID, ttl)
	if err != nil {
		return err
	}
	writeJSON(w, status, h.sandboxJSON(sb, tokenOf(r)))
	return nil
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request, id string) error {
	sb, err := h.live(r.Context(), id)
	if err != nil {
		return err
	}
	if sb.State == api.StatePaused {
		return fmt.Errorf("sandbox %s is already paused: %w", id, errdefs.ErrAlreadyExists)
	}
	if err := h.b.Pause(r.Context(), sb.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
