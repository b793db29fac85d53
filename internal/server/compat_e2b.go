package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/compat/e2b"
	"github.com/dsec-project/dsec/internal/store"
)

// DefaultE2BTemplates is the template table when --e2b-templates is not
// given: E2B's default template "base" on Debian 12 (make debian-base).
var DefaultE2BTemplates = map[string]api.LayerRefs{"base": {Base: "debian:12"}}

// e2bBackend is the control plane as the E2B surface sees it. It runs the
// /v1 handlers themselves for the principal in the context, so every rule
// of /v1 (validation, quotas, tenancy, leases) holds on E2B too.
type e2bBackend struct{ compatBackend }

// recorder is the ResponseWriter a /v1 handler answers into when the E2B
// surface calls it.
type recorder struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.h }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(status int)      { r.status = status }

// call runs a /v1 handler on sandbox id (if any) with a JSON body (if
// any) and decodes its answer into out (if any).
func (b e2bBackend) call(ctx context.Context, h func(http.ResponseWriter, *http.Request) error, method, id string, in, out any) error {
	body := io.Reader(http.NoBody)
	if in != nil {
		j, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, "/", body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if id != "" {
		req.SetPathValue("id", id)
	}
	rec := &recorder{h: http.Header{}, status: http.StatusOK}
	if err := h(rec, req); err != nil {
		return err
	}
	if out != nil {
		return json.Unmarshal(rec.body.Bytes(), out)
	}
	return nil
}

func (b e2bBackend) Create(ctx context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := b.call(ctx, b.s.createSandbox, http.MethodPost, "", req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

func (b e2bBackend) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	sb, err := b.s.sandboxFor(ctx, id)
	if err != nil {
		return nil, err
	}
	v := b.s.view(sb)
	return &v, nil
}

func (b e2bBackend) List(ctx context.Context, labels map[string]string, pageToken string, limit int) ([]api.Sandbox, string, error) {
	list, next, err := b.s.store.ListSandboxes(ctx, store.SandboxFilter{Tenant: principalFrom(ctx).Tenant,
		States: []string{api.StateRunning, api.StatePaused}, Labels: labels, Limit: limit, PageToken: pageToken})
	if err != nil {
		return nil, "", err
	}
	out := make([]api.Sandbox, 0, len(list))
	for _, sb := range list {
		out = append(out, b.s.view(sb))
	}
	return out, next, nil
}

func (b e2bBackend) Delete(ctx context.Context, id string) error {
	return b.call(ctx, b.s.deleteSandbox, http.MethodDelete, id, nil, nil)
}

func (b e2bBackend) Renew(ctx context.Context, id string, ttl time.Duration) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := b.call(ctx, b.s.renewSandbox, http.MethodPost, id, api.RenewRequest{TTLSeconds: int64(ttl / time.Second)}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

func (b e2bBackend) Pause(ctx context.Context, id string) error {
	return b.call(ctx, b.s.pauseSandbox, http.MethodPost, id, nil, nil)
}

func (b e2bBackend) Resume(ctx context.Context, id string) error {
	return b.call(ctx, b.s.resumeSandbox, http.MethodPost, id, nil, nil)
}

// Agent reaches a running sandbox's agent; the sandbox counts as active
// until the answer's body is closed.
func (b e2bBackend) Agent(ctx context.Context, id, method, path string, q url.Values, body io.Reader) (*http.Response, error) {
	sb, n, err := b.s.liveSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	end := b.s.begin(ctx, sb)
	resp, err := n.client.AgentDo(ctx, sb.API.ID, method, path, q, body)
	if err != nil {
		end()
		return nil, err
	}
	resp.Body = &endCloser{ReadCloser: resp.Body, end: end}
	return resp, nil
}

type endCloser struct {
	io.ReadCloser
	once sync.Once
	end  func()
}

func (c *endCloser) Close() error {
	err := c.ReadCloser.Close()
	c.once.Do(c.end)
	return err
}

// withE2B serves E2B's API in front of mux's routes (see
// internal/compat/e2b), unless it is turned off.
func (s *Server) withE2B(mux *routeMux) {
	cfg := s.cfg.Compat.E2B
	if s.cfg.Compat.E2BOff {
		return
	}
	if cfg.Templates == nil {
		cfg.Templates = DefaultE2BTemplates
	}
	if cfg.Logger == nil {
		cfg.Logger = s.log
	}
	h := e2b.New(e2bBackend{compatBackend{s}}, cfg)
	mux.fronts = append(mux.fronts, front{match: e2b.Match, h: s.instrument("E2B", h.ServeHTTP)})
}
