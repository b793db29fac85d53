package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/fncall"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/store"
)

// FnCall timeouts: a call is short; its timeout_ms bounds the wait for a
// free sandbox and the command together.
const (
	fncallDefaultTimeout = 60 * time.Second
	fncallMaxTimeout     = 10 * time.Minute
)

// poolRuntime builds the FnCall pools' sandboxes through the control
// plane's own create path, so they are placed, recorded and reconciled like
// any other: container sandboxes of the tenant with backend "fncall" and
// the pool label.
type poolRuntime struct{ s *Server }

func (rt poolRuntime) Create(ctx context.Context, tenant, pool string, spec any) (fncall.Sandbox, error) {
	p := spec.(plan)
	p.req.Labels = map[string]string{api.LabelFnCallPool: pool}
	p.req.TTLSeconds = int64(rt.s.cfg.MaxTTL / time.Second)
	sb, err := rt.s.create(ctx, tenant, p)
	if err != nil {
		return fncall.Sandbox{}, err
	}
	return fncall.Sandbox{ID: sb.API.ID, Node: sb.API.Node}, nil
}

func (rt poolRuntime) Recycle(ctx context.Context, sb fncall.Sandbox) (bool, error) {
	n, err := rt.s.nodes.get(sb.Node)
	if err != nil {
		return false, err
	}
	return n.client.Recycle(ctx, sb.ID)
}

func (rt poolRuntime) Destroy(ctx context.Context, sb fncall.Sandbox) error {
	rec, err := rt.s.store.GetSandbox(ctx, sb.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return rt.s.destroy(ctx, rec)
}

// poolKey names the pool of a validated spec: one per tenant, layer stack,
// resources, network and environment — everything a sandbox is built with.
func poolKey(tenant string, p plan) string {
	b, _ := json.Marshal(struct {
		Tenant    string
		Digests   []string
		Resources api.Resources
		Network   *api.Network
		Env       map[string]string // json sorts the keys
		Phase     string
	}{tenant, p.digests, p.req.Resources, p.req.Network, p.req.Env, p.req.Phase})
	return string(b)
}

func poolInfo(tenant string, p plan) fncall.Info {
	return fncall.Info{Tenant: tenant, Describe: api.FnCallPool{Layers: *p.req.Layers, Resources: p.req.Resources}}
}

// fncallPlan validates the sandbox half of a FnCall request.
func (s *Server) fncallPlan(ctx context.Context, tenant string, layers *api.LayerRefs, res api.Resources, env map[string]string) (plan, error) {
	return s.validate(ctx, tenant, api.CreateSandboxRequest{
		Backend: api.BackendFnCall, Layers: layers, Resources: res, Env: env,
	})
}

// fncallCall is POST /v1/fncall: lease a clean sandbox, run the command,
// hand the sandbox back to be reset.
func (s *Server) fncallCall(w http.ResponseWriter, r *http.Request) error {
	var req api.FnCallRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if (len(req.Cmd) == 0) == (req.Shell == "") {
		return errdefs.Invalid("exactly one of cmd and shell must be set")
	}
	if req.TimeoutMs < 0 || time.Duration(req.TimeoutMs)*time.Millisecond > fncallMaxTimeout {
		return errdefs.Invalid("timeout_ms must be between 0 and %d", fncallMaxTimeout.Milliseconds())
	}
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	if timeout == 0 {
		timeout = fncallDefaultTimeout
	}
	tenant := principalFrom(r.Context()).Tenant
	// The sandbox's environment is the pool's; the call's env goes on the
	// exec, so one pool serves calls with any env.
	p, err := s.fncallPlan(r.Context(), tenant, req.Layers, req.Resources, nil)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	lease, err := s.fncall.Acquire(ctx, poolKey(tenant, p), poolInfo(tenant, p), p, true)
	if err != nil {
		return err
	}
	clean := true
	defer func() { s.fncall.Release(lease, clean) }()
	sb := lease.Sandbox()
	n, err := s.nodes.get(sb.Node)
	if err != nil {
		clean = false
		return err
	}
	exec := api.ExecRequest{
		Cmd: req.Cmd, Shell: req.Shell, Env: req.Env, Cwd: req.Cwd, Stdin: req.Stdin,
		StdinEncoding: req.StdinEncoding, MaxOutputBytes: req.MaxOutputBytes,
		TimeoutMs: max(1, time.Until(deadline).Milliseconds()),
	}
	if strings.Contains(r.Header.Get("Accept"), "application/x-ndjson") {
		body, _ := json.Marshal(&exec)
		r2 := r.Clone(r.Context())
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		r2.Header.Set("Content-Type", "application/json")
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		n.client.ProxyAgent(sw, r2, sb.ID, "/exec")
		clean = sw.status < 500
		return nil
	}
	// The exec's own timeout ends the command; the context only guards
	// against a node that never answers.
	ectx, ecancel := context.WithDeadline(context.WithoutCancel(r.Context()), deadline.Add(30*time.Second))
	defer ecancel()
	res, err := n.client.Exec(ectx, sb.ID, &exec)
	if err != nil {
		if code := errdefs.Code(err); code == api.CodeUnavailable || code == api.CodeInternal || code == api.CodeDeadlineExceeded {
			clean = false
		}
		return err
	}
	if r.Context().Err() != nil {
		return r.Context().Err()
	}
	httpapi.WriteJSON(w, http.StatusOK, res)
	return nil
}

// takeWarm is a create with backend fncall: the sandbox comes out of the
// pool of its spec, already running, and becomes an ordinary sandbox of the
// tenant (with the request's labels and TTL). The pool refills behind it.
func (s *Server) takeWarm(ctx context.Context, tenant string, p plan) (store.Sandbox, error) {
	lease, err := s.fncall.Acquire(ctx, poolKey(tenant, p), poolInfo(tenant, p), p, false)
	if err != nil {
		return store.Sandbox{}, err
	}
	fsb := s.fncall.Detach(lease)
	sb, err := s.store.GetSandbox(ctx, fsb.ID)
	if err == nil {
		now := time.Now().UTC()
		ttl := time.Duration(p.req.TTLSeconds) * time.Second
		if ttl == 0 {
			ttl = s.cfg.DefaultTTL
		}
		expires := now.Add(ttl)
		sb.API.Labels, sb.API.ExpiresAt, sb.LastActive = p.req.Labels, &expires, now
		err = s.store.UpdateSandbox(ctx, &sb)
	}
	if err != nil {
		s.poolRuntime().Destroy(context.WithoutCancel(ctx), fsb)
		return store.Sandbox{}, err
	}
	return sb, nil
}

func (s *Server) poolRuntime() poolRuntime { return poolRuntime{s} }

// nodeBackend is the backend a node runs for a sandbox of backend b: the
// FnCall pools are made of container sandboxes.
func nodeBackend(b string) string {
	if b == api.BackendFnCall {
		return api.BackendContainer
	}
	return b
}

// warmPool is POST /v1/fncall/pools.
func (s *Server) warmPool(w http.ResponseWriter, r *http.Request) error {
	var req api.FnCallWarmRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.Size < 0 {
		return errdefs.Invalid("size must not be negative")
	}
	tenant := principalFrom(r.Context()).Tenant
	p, err := s.fncallPlan(r.Context(), tenant, req.Layers, req.Resources, nil)
	if err != nil {
		return err
	}
	if req.Size > s.fncall.Config().Max {
		return errdefs.Invalid("size %d over the pool maximum of %d", req.Size, s.fncall.Config().Max)
	}
	key := poolKey(tenant, p)
	s.fncall.Warm(key, poolInfo(tenant, p), p, req.Size)
	for _, ps := range s.fncall.Pools(tenant) {
		if ps.ID == fncall.PoolID(key) {
			httpapi.WriteJSON(w, http.StatusOK, poolView(ps))
			return nil
		}
	}
	return errdefs.NotFound("fncall pool")
}

// listPools is GET /v1/fncall/pools.
func (s *Server) listPools(w http.ResponseWriter, r *http.Request) error {
	out := api.FnCallPoolList{Pools: []api.FnCallPool{}}
	for _, ps := range s.fncall.Pools(principalFrom(r.Context()).Tenant) {
		out.Pools = append(out.Pools, poolView(ps))
	}
	slices.SortFunc(out.Pools, func(a, b api.FnCallPool) int { return strings.Compare(a.ID, b.ID) })
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func poolView(ps fncall.PoolStats) api.FnCallPool {
	v, _ := ps.Describe.(api.FnCallPool)
	v.ID, v.Size, v.Idle, v.Busy, v.Resetting, v.Creating = ps.ID, ps.Size, ps.Idle, ps.Busy, ps.Resetting, ps.Creating
	v.Waiting, v.Target, v.Min, v.Max, v.Calls, v.Resets = ps.Waiting, ps.Target, ps.Min, ps.Max, ps.Calls, ps.Resets
	return v
}

// poolGuard refuses direct use of a sandbox that belongs to a FnCall pool:
// calls share it, so nobody may change it outside a call.
func poolGuard(sb store.Sandbox) error {
	if pool := sb.API.Labels[api.LabelFnCallPool]; pool != "" {
		return fmt.Errorf("sandbox %s is a warm sandbox of fncall pool %s: use POST /v1/fncall: %w",
			sb.API.ID, pool, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// destroyStalePools destroys the pool sandboxes a previous run of the
// server left: pools live in memory, so after a restart nobody owns them.
// It runs while the server already serves: a pool sandbox this run
// created (its first call came in first) is not stale.
func (s *Server) destroyStalePools(ctx context.Context) {
	f := store.SandboxFilter{AllTenants: true, Limit: 1000,
		States: []string{api.StateCreating, api.StateRunning, api.StatePaused}}
	var stale []store.Sandbox
	for {
		page, next, err := s.store.ListSandboxes(ctx, f)
		if err != nil {
			s.log.WarnContext(ctx, "fncall: list stale pool sandboxes", "err", err)
			return
		}
		for _, sb := range page {
			if sb.API.Labels[api.LabelFnCallPool] != "" && sb.API.CreatedAt.Before(s.started) {
				stale = append(stale, sb)
			}
		}
		if next == "" {
			break
		}
		f.PageToken = next
	}
	for _, sb := range stale {
		if err := s.destroy(ctx, sb); err != nil {
			s.log.WarnContext(ctx, "fncall: destroy a stale pool sandbox", "sandbox", sb.API.ID, "err", err)
		}
	}
	if len(stale) > 0 {
		s.log.InfoContext(ctx, "fncall: destroyed pool sandboxes of a previous run", "count", len(stale))
	}
}
