package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/compat/e2b"
	"github.com/dsec-project/dsec/internal/compat/fusion"
	"github.com/dsec-project/dsec/internal/fncall"
)

// CompatConfig configures the client-compatibility surfaces served beside
// /v1 (see internal/compat).
type CompatConfig struct {
	// FusionPrefix is where SandboxFusion's /run_code and /v1/ping are
	// mounted: DefaultFusionPrefix if empty, "/" for the root, "-" for
	// nowhere.
	FusionPrefix string
	// Fusion configures it (its layers are those of the sandboxes calls
	// run in).
	Fusion fusion.Config
	// E2B configures E2B's API (its template table: nil is
	// DefaultE2BTemplates); E2BOff turns it off.
	E2B    e2b.Config
	E2BOff bool
}

// Defaults of CompatConfig.
const (
	DefaultFusionPrefix = "/sandboxfusion"
	DefaultFusionBase   = "sandboxfusion:latest"
)

// compatBackend is the control plane as the compatibility surfaces see
// it: every call acts for the principal in its context, exactly as the
// /v1 handlers do, so tenants stay apart on every surface.
type compatBackend struct{ s *Server }

func (b compatBackend) Authenticate(ctx context.Context, key string) (context.Context, error) {
	p, err := b.s.auth.authenticateKey(ctx, key)
	if err != nil {
		return nil, err
	}
	return context.WithValue(ctx, principalKey{}, p), nil
}

// Lease takes a clean sandbox of a FnCall pool for one call.
func (b compatBackend) Lease(ctx context.Context, layers api.LayerRefs, res api.Resources) (fusion.Box, error) {
	tenant := principalFrom(ctx).Tenant
	p, err := b.s.fncallPlan(ctx, tenant, &layers, res, nil)
	if err != nil {
		return nil, err
	}
	lease, err := b.s.fncall.Acquire(ctx, poolKey(tenant, p), poolInfo(tenant, p), p, true)
	if err != nil {
		return nil, err
	}
	sb := lease.Sandbox()
	n, err := b.s.nodes.get(sb.Node)
	if err != nil {
		b.s.fncall.Release(lease, false)
		return nil, err
	}
	return &leasedBox{s: b.s, lease: lease, n: n, id: sb.ID}, nil
}

// leasedBox is a FnCall sandbox leased for one call.
type leasedBox struct {
	s     *Server
	lease *fncall.Lease
	n     *node
	id    string
}

func (l *leasedBox) Exec(ctx context.Context, req *api.ExecRequest) (*api.ExecResult, error) {
	// The exec's own timeout ends the command; this only guards against
	// a node that never answers.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(req.TimeoutMs)*time.Millisecond+30*time.Second)
	defer cancel()
	return l.n.client.Exec(ctx, l.id, req)
}

func (l *leasedBox) WriteFile(ctx context.Context, path string, data []byte) error {
	resp, err := l.n.client.AgentDo(ctx, l.id, http.MethodPut, "/files", url.Values{"path": {path}}, strings.NewReader(string(data)))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

func (l *leasedBox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	resp, err := l.n.client.AgentDo(ctx, l.id, http.MethodGet, "/files", url.Values{"path": {path}}, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "application/json" {
		return nil, fmt.Errorf("%s is a directory", path)
	}
	return io.ReadAll(resp.Body)
}

func (l *leasedBox) Release(clean bool) { l.s.fncall.Release(l.lease, clean) }

// compatRoutes mounts the compatibility surfaces on mux.
func (s *Server) compatRoutes(mux *routeMux) {
	b := compatBackend{s}
	s.swerexRoutes(mux)
	c := s.cfg.Compat
	if c.FusionPrefix == "" {
		c.FusionPrefix = DefaultFusionPrefix
	}
	if c.FusionPrefix != "-" {
		pre := strings.TrimSuffix(c.FusionPrefix, "/")
		cfg := c.Fusion
		if cfg.Layers.Base == "" {
			cfg.Layers.Base = DefaultFusionBase
		}
		if cfg.Logger == nil {
			cfg.Logger = s.log
		}
		h := http.StripPrefix(pre, fusion.New(b, cfg))
		mux.Handle("POST "+pre+"/run_code", s.instrument("POST /run_code", h.ServeHTTP))
		mux.Handle("GET "+pre+"/v1/ping", s.instrument("GET /v1/ping", h.ServeHTTP))
		// A key given in the path: …/dsec_<key>/run_code.
		mux.Handle("POST "+pre+"/{key}/run_code", s.instrument("POST /run_code", h.ServeHTTP))
	}
}
