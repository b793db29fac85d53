package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/policy"
	"github.com/dsec-project/dsec/internal/store"
)

// createTimeout bounds how long the control plane waits for a node to
// build a sandbox. Creates run detached from the client's request so that
// a disconnect never leaves a half-made sandbox.
const createTimeout = 2 * time.Minute

var (
	labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)
	envKeyRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// plan is a validated create request: what to place and what to build.
type plan struct {
	req     api.CreateSandboxRequest
	digests []string // base first
	// wait bounds the create's wait for admission while nodes are busy;
	// a close of gone (its client went away) ends the wait.
	wait time.Duration
	gone <-chan struct{}
}

// validate checks a create request, fills defaults and resolves layers.
func (s *Server) validate(ctx context.Context, tenant string, req api.CreateSandboxRequest) (plan, error) {
	if req.Backend == "" {
		req.Backend = api.BackendContainer
	}
	switch req.Backend {
	case api.BackendContainer, api.BackendFnCall, api.BackendMicroVM, api.BackendFullVM:
	default:
		return plan{}, errdefs.Invalid("unknown backend %q (want container, fncall, microvm or fullvm)", req.Backend)
	}
	if !s.nodes.offers(nodeBackend(req.Backend)) {
		return plan{}, errdefs.Invalid("backend %q is not offered by any node of this cluster", req.Backend)
	}
	var digests []string
	var top store.Layer // the top layer, whose build config gives defaults
	switch {
	case req.Snapshot != "" && req.Layers != nil:
		return plan{}, errdefs.Invalid("give layers or snapshot, not both")
	case req.Snapshot != "":
		stack, err := s.snapshotStack(ctx, tenant, req.Snapshot)
		if err != nil {
			return plan{}, err
		}
		if err := s.snapshotFits(ctx, tenant, req.Backend, stack); err != nil {
			return plan{}, err
		}
		digests = stack
		if top, err = s.cachedLayer(ctx, tenant, req.Snapshot); err != nil {
			return plan{}, err
		}
		req.Layers = &api.LayerRefs{}
	case req.Layers == nil || req.Layers.Base == "":
		return plan{}, errdefs.Invalid("layers.base is required")
	}
	for _, l := range []struct{ ref, kind string }{
		{req.Layers.Base, api.KindBase}, {req.Layers.Workspace, api.KindWorkspace}, {req.Layers.Toolkit, api.KindToolkit},
	} {
		if l.ref == "" {
			continue
		}
		lay, err := s.cachedLayer(ctx, tenant, l.ref)
		if err != nil {
			return plan{}, err
		}
		if err := layerFits(req.Backend, l.kind, l.ref, lay.Kind); err != nil {
			return plan{}, err
		}
		digests = append(digests, lay.Digest)
		top = lay
	}
	if err := s.applyLayerConfig(ctx, &req, top); err != nil {
		return plan{}, err
	}
	if err := s.fillResources(&req.Resources); err != nil {
		return plan{}, err
	}
	if req.Network == nil {
		req.Network = &api.Network{Mode: api.NetworkNone}
	}
	if err := policy.CheckNetwork(req.Network); err != nil {
		return plan{}, err
	}
	if err := s.resolveProfile(&req); err != nil {
		return plan{}, err
	}
	if err := policy.CheckPhases(req.Phases, req.Phase); err != nil {
		return plan{}, err
	}
	if req.TTLSeconds < 0 {
		return plan{}, errdefs.Invalid("ttl_seconds must not be negative")
	}
	if req.TTLSeconds > int64(s.cfg.MaxTTL/time.Second) {
		return plan{}, errdefs.Invalid("ttl_seconds over the maximum of %d", int64(s.cfg.MaxTTL.Seconds()))
	}
	if req.IdleTimeoutSeconds < 0 || req.IdleTimeoutSeconds > int64(s.cfg.MaxTTL/time.Second) {
		return plan{}, errdefs.Invalid("idle_timeout_seconds must be between 0 and %d", int64(s.cfg.MaxTTL.Seconds()))
	}
	if len(req.Labels) > 64 {
		return plan{}, errdefs.Invalid("at most 64 labels")
	}
	for k, v := range req.Labels {
		if !labelKeyRE.MatchString(k) || len(v) > 256 {
			return plan{}, errdefs.Invalid("bad label %q: keys are [A-Za-z0-9._/-], up to 63 chars; values up to 256", k)
		}
	}
	for k, v := range req.Env {
		if !envKeyRE.MatchString(k) || strings.ContainsRune(v, 0) {
			return plan{}, errdefs.Invalid("bad environment variable %q", k)
		}
	}
	wait, err := admissionWait(req.AdmissionTimeoutSeconds)
	if err != nil {
		return plan{}, err
	}
	return plan{req: req, digests: digests, wait: wait}, nil
}

func (s *Server) fillResources(r *api.Resources) error {
	d := s.cfg.Defaults
	if r.CPU == 0 {
		r.CPU = d.CPU
	}
	if r.MemoryMB == 0 {
		r.MemoryMB = d.MemoryMB
	}
	if r.DiskMB == 0 {
		r.DiskMB = d.DiskMB
	}
	if r.Pids == 0 {
		r.Pids = d.Pids
	}
	switch {
	case r.CPU < 0.01 || r.CPU > 256:
		return errdefs.Invalid("resources.cpu must be between 0.01 and 256")
	case r.MemoryMB < 16:
		return errdefs.Invalid("resources.memory_mb must be at least 16")
	case r.DiskMB < 16:
		return errdefs.Invalid("resources.disk_mb must be at least 16")
	case r.Pids < 16 || r.Pids > 1<<22:
		return errdefs.Invalid("resources.pids must be between 16 and %d", 1<<22)
	}
	return nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if err := checkServerLabels(req.Labels); err != nil {
		return err
	}
	tenant := principalFrom(r.Context()).Tenant
	p, err := s.validate(r.Context(), tenant, req)
	if err != nil {
		return err
	}
	p.gone = r.Context().Done()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), p.wait+createTimeoutFor(p.req.Backend))
	defer cancel()
	var sb store.Sandbox
	if p.req.Backend == api.BackendFnCall {
		sb, err = s.takeWarm(ctx, tenant, p)
	} else {
		sb, err = s.create(ctx, tenant, p)
	}
	if err != nil {
		return err
	}
	if r.Context().Err() != nil {
		// Nobody is left to learn the id: destroy rather than leak.
		s.log.InfoContext(ctx, "client left during create; destroying", "sandbox", sb.API.ID)
		s.destroy(ctx, sb)
		return r.Context().Err()
	}
	httpapi.WriteJSON(w, http.StatusCreated, s.view(sb))
	return nil
}

// sandboxFor loads a sandbox of the caller's tenant. Another tenant's
// sandbox is reported exactly like a missing one.
func (s *Server) sandboxFor(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := s.store.GetSandbox(ctx, id)
	if err == nil && sb.Tenant != principalFrom(ctx).Tenant {
		err = errdefs.NotFound("sandbox %s", id)
	}
	return sb, err
}

// liveSandbox loads a sandbox that can take commands.
func (s *Server) liveSandbox(ctx context.Context, id string) (store.Sandbox, *node, error) {
	// A cached route is a running sandbox's record of at most routeTTL
	// ago, dropped by every write of it through this server.
	if sb, ok := s.routes.get(id); ok && sb.Tenant == principalFrom(ctx).Tenant {
		if waited, err := s.gates.wait(ctx, id); err != nil {
			return sb, nil, err
		} else if !waited {
			if n, err := s.nodes.get(sb.API.Node); err == nil {
				return sb, n, nil
			}
		}
	}
	gen := s.routes.generation()
	sb, err := s.sandboxFor(ctx, id)
	if err != nil {
		return sb, nil, err
	}
	if sb, err = s.afterCheckpoint(ctx, sb); err != nil {
		return sb, nil, err
	}
	switch sb.API.State {
	case api.StateRunning:
	case api.StateDeleted, api.StateFailed:
		return sb, nil, errdefs.NotFound("sandbox %s is %s", id, sb.API.State)
	default:
		return sb, nil, fmt.Errorf("sandbox %s is %s: %w", id, sb.API.State, errdefs.ErrFailedPrecondition)
	}
	if err := poolGuard(sb); err != nil {
		return sb, nil, err
	}
	n, err := s.nodes.get(sb.API.Node)
	if err == nil {
		s.routes.put(sb, gen)
	}
	return sb, n, err
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandboxFor(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, s.withDisplay(r.Context(), s.view(sb)))
	return nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f := store.SandboxFilter{Tenant: principalFrom(r.Context()).Tenant, Limit: 100, PageToken: q.Get("page_token")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return errdefs.Invalid("limit must be 1..1000")
		}
		f.Limit = n
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || !labelKeyRE.MatchString(k) {
			return errdefs.Invalid("label filter %q: want key=value", l)
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	f.Node, f.Backend = q.Get("node"), q.Get("backend")
	if st := q.Get("state"); st != "" {
		f.States = strings.Split(st, ",")
	} else if all, err := queryBool(q, "all"); err != nil {
		return err
	} else if !all {
		f.States = []string{api.StateCreating, api.StateRunning, api.StatePaused, api.StateLost}
	}
	list, next, err := s.store.ListSandboxes(r.Context(), f)
	if err != nil {
		return err
	}
	out := api.SandboxList{Sandboxes: make([]api.Sandbox, 0, len(list)), NextPageToken: next}
	for _, sb := range list {
		out.Sandboxes = append(out.Sandboxes, s.view(sb))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// countSandboxes answers GET /v1/sandboxes:count: the caller's tenant's
// sandboxes counted by state and backend in the store (one GROUP BY on
// an index), so an overview need not list them; all_tenants=1 (admin
// keys only) counts every tenant's.
func (s *Server) countSandboxes(w http.ResponseWriter, r *http.Request) error {
	p := principalFrom(r.Context())
	all, err := queryBool(r.URL.Query(), "all_tenants")
	if err != nil {
		return err
	}
	tenant := p.Tenant
	if all {
		if !p.Admin {
			return fmt.Errorf("all_tenants needs an admin key: %w", errdefs.ErrPermissionDenied)
		}
		tenant = ""
	}
	list, err := s.store.CountSandboxes(r.Context(), tenant)
	if err != nil {
		return err
	}
	out := api.SandboxCounts{ByState: map[string]int64{}, ByBackend: map[string]int64{}, Groups: []api.SandboxCountGroup{}}
	group := map[[2]string]int{}
	for _, c := range list {
		out.Total += c.Count
		out.ByState[c.State] += c.Count
		out.ByBackend[c.Backend] += c.Count
		k := [2]string{c.State, c.Backend}
		if i, ok := group[k]; ok {
			out.Groups[i].Count += c.Count
			continue
		}
		group[k] = len(out.Groups)
		out.Groups = append(out.Groups, api.SandboxCountGroup{State: c.State, Backend: c.Backend, Count: c.Count})
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandboxFor(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := s.destroy(context.WithoutCancel(r.Context()), sb); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// destroy removes a sandbox from its node and marks its record deleted. It
// is idempotent. Once the node has destroyed it the record says deleted,
// whatever changed it meanwhile (a renew racing the reaper).
func (s *Server) destroy(ctx context.Context, sb store.Sandbox) error {
	if sb.DeletedAt != nil {
		return nil
	}
	s.fncall.Forget(sb.API.ID)
	defer s.conns.closeAll(sb.API.ID)
	if sb.API.State != api.StateLost {
		n, err := s.nodes.get(sb.API.Node)
		if err != nil {
			return err
		}
		if err := n.client.Destroy(ctx, sb.API.ID); err != nil {
			return fmt.Errorf("destroy sandbox %s: %w", sb.API.ID, err)
		}
	}
	now := time.Now().UTC()
	why := sb.API.Error
	for {
		wasLive := sb.API.State != api.StateFailed
		sb.API.State, sb.DeletedAt = api.StateDeleted, &now
		err := s.store.UpdateSandbox(ctx, &sb)
		if errors.Is(err, store.ErrConflict) {
			if sb, err = s.store.GetSandbox(ctx, sb.API.ID); err != nil {
				return err
			}
			if sb.DeletedAt != nil {
				return nil // someone else recorded it
			}
			if why != "" {
				sb.API.Error = why
			}
			continue
		}
		if err != nil {
			return err
		}
		if wasLive {
			s.sched.Release(sb.API.Node, sb.API.Resources)
		}
		s.forget(sb.API.ID)
		return nil
	}
}

func (s *Server) resetSandbox(w http.ResponseWriter, r *http.Request) error {
	return s.lifecycle(w, r, []string{api.StateRunning, api.StatePaused}, api.StateRunning,
		func(ctx context.Context, c *edge.Client, sb *store.Sandbox) error {
			// Bump first: if the reset fails half-way, the state is gone all
			// the same, and trajectory steps must not replay over it.
			sb.Generation++
			if err := s.store.UpdateSandbox(ctx, sb); err != nil {
				return err
			}
			return c.Reset(ctx, sb.API.ID)
		})
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.PauseRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil && !errors.Is(err, httpapi.ErrEmptyBody) {
		return err
	}
	switch req.Memory {
	case "", api.PauseMemoryKeep:
		return s.lifecycle(w, r, []string{api.StateRunning}, api.StatePaused,
			func(ctx context.Context, c *edge.Client, sb *store.Sandbox) error { return c.Pause(ctx, sb.API.ID) })
	case api.PauseMemoryDisk:
	default:
		return errdefs.Invalid("memory %q: want %q (the default) or %q", req.Memory, api.PauseMemoryKeep, api.PauseMemoryDisk)
	}
	// Hibernate: the guest's memory goes to its node's disk and its VMM
	// ends; resume restores it.
	return s.lifecycle(w, r, []string{api.StateRunning, api.StatePaused}, api.StatePaused,
		func(ctx context.Context, c *edge.Client, sb *store.Sandbox) error {
			if sb.API.Backend != api.BackendMicroVM {
				return errdefs.Invalid("sandbox %s is a %s: only microVMs pause with memory on disk (memory \"disk\"); pause it without",
					sb.API.ID, sb.API.Backend)
			}
			return c.Hibernate(ctx, sb.API.ID)
		})
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	return s.lifecycle(w, r, []string{api.StatePaused}, api.StateRunning,
		func(ctx context.Context, c *edge.Client, sb *store.Sandbox) error { return c.Resume(ctx, sb.API.ID) })
}

// lifecycle runs an operation on a sandbox in one of the states from, on
// its node, and records the state it leaves the sandbox in.
func (s *Server) lifecycle(w http.ResponseWriter, r *http.Request, from []string, after string,
	op func(context.Context, *edge.Client, *store.Sandbox) error) error {
	sb, err := s.sandboxFor(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if sb, err = s.afterCheckpoint(r.Context(), sb); err != nil {
		return err
	}
	ctx := context.WithoutCancel(r.Context()) // once started, see it through
	switch {
	case slices.Contains(from, sb.API.State):
	case sb.API.State == api.StateDeleted || sb.API.State == api.StateFailed:
		return errdefs.NotFound("sandbox %s is %s", sb.API.ID, sb.API.State)
	default:
		return fmt.Errorf("sandbox %s is %s: %w", sb.API.ID, sb.API.State, errdefs.ErrFailedPrecondition)
	}
	if err := poolGuard(sb); err != nil {
		return err
	}
	n, err := s.nodes.get(sb.API.Node)
	if err != nil {
		return err
	}
	if err := op(ctx, n.client, &sb); err != nil {
		return err
	}
	sb.API.State = after
	sb.LastActive = time.Now().UTC()
	if err := s.store.UpdateSandbox(ctx, &sb); err != nil {
		return err
	}
	s.touch(ctx, sb)
	httpapi.WriteJSON(w, http.StatusOK, s.view(sb))
	return nil
}

// runsOn reports whether the node runs the sandbox unpaused.
func runsOn(ctx context.Context, c *edge.Client, id string) bool {
	st, err := c.Get(ctx, id)
	return err == nil && st.State == api.StateRunning
}
