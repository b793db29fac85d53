package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/policy"
	"github.com/dsec-project/dsec/internal/scheduler"
	"github.com/dsec-project/dsec/internal/store"
)

// maxNodeTries bounds how many nodes one create tries: a node may refuse
// (it is full by its own measure, cannot fetch a layer, is unreachable) or
// the store may find it full (another replica filled it first).
const maxNodeTries = 4

// newRecord is the record of a sandbox about to be placed.
func (s *Server) newRecord(tenant string, p plan, now time.Time) store.Sandbox {
	req := p.req
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if ttl == 0 {
		ttl = s.cfg.DefaultTTL
	}
	expires := now.Add(ttl)
	idle := req.IdleTimeoutSeconds
	if idle == 0 {
		idle = int64(s.cfg.DefaultIdleTimeout / time.Second)
	}
	return store.Sandbox{
		API: api.Sandbox{
			ID: sandboxID(now), Backend: req.Backend, State: api.StateCreating,
			Layers: *req.Layers, Snapshot: req.Snapshot, Resources: req.Resources, Network: *req.Network, Phase: req.Phase,
			Phases: req.Phases, Profile: req.Profile,
			Labels: req.Labels, Env: req.Env, Burst: req.Burst, CreatedAt: now, ExpiresAt: &expires,
			TTLSeconds: int64(ttl / time.Second), IdleTimeoutSeconds: idle,
		},
		Tenant: tenant, LayerDigests: p.digests, LastActive: now,
	}
}

func schedRequest(p plan) scheduler.Request {
	return scheduler.Request{Backend: nodeBackend(p.req.Backend), Resources: p.req.Resources, Layers: p.digests, Burst: p.req.Burst}
}

// create places and builds one sandbox and records it. It is the one path
// every single create takes.
func (s *Server) create(ctx context.Context, tenant string, p plan) (store.Sandbox, error) {
	start := time.Now()
	sb := s.newRecord(tenant, p, start.UTC())
	if err := s.placeAndBuild(ctx, &sb, p, false); err != nil {
		s.metrics.creates.WithLabelValues(p.req.Backend, errdefs.Code(err)).Inc()
		return store.Sandbox{}, err
	}
	s.metrics.creates.WithLabelValues(p.req.Backend, "ok").Inc()
	s.metrics.createDur.Observe(time.Since(start).Seconds())
	return sb, nil
}

// placeAndBuild gets a sandbox onto a node and built there. placed says
// its record is already inserted and charged to sb.API.Node (a batch
// placed it in bulk); otherwise the scheduler picks a node from this
// replica's view and the store charges the node and the tenant in the same
// transaction as it inserts the record: the authoritative reservation,
// since another replica may have filled the node meanwhile. A node the
// store finds full, or whose edge refuses the sandbox, is excluded and the
// sandbox tried elsewhere, moving its record and charge. On failure an
// inserted record is marked failed (which releases its charge).
func (s *Server) placeAndBuild(ctx context.Context, sb *store.Sandbox, p plan, placed bool) error {
	req := schedRequest(p)
	inserted := placed
	fail := func(err error) error {
		if inserted {
			s.recordFailed(context.WithoutCancel(ctx), sb, err)
		}
		return err
	}
	var lastErr, refused error
	var refusedBy string
	for range maxNodeTries {
		if !placed {
			nodeID, err := s.reserve(ctx, sb.Tenant, req, p)
			if err != nil {
				switch {
				case refused != nil && errors.Is(err, errdefs.ErrResourceExhausted) && !errors.Is(err, scheduler.ErrBusy):
					// The nodes with room refused it: their reason (a guest
					// that does not boot, a layer that cannot be fetched),
					// in its own class, says more than "no room" would.
					err = fmt.Errorf("sandbox %s: node %s refused it and no other node has room: %w", sb.API.ID, refusedBy, refused)
				case lastErr != nil:
					err = fmt.Errorf("%w (after: %v)", err, lastErr)
				}
				return fail(err)
			}
			if inserted {
				err = s.store.MoveSandbox(ctx, sb, nodeID)
			} else {
				sb.API.Node = nodeID
				err = s.store.PlaceSandboxes(ctx, []*store.Sandbox{sb})
				if errors.Is(err, errdefs.ErrAlreadyExists) {
					// Two ids drew the same millisecond and random bits.
					sb.API.ID = sandboxID(time.Now())
					err = s.store.PlaceSandboxes(ctx, []*store.Sandbox{sb})
				}
				inserted = err == nil
			}
			if err != nil {
				s.sched.Release(nodeID, req.Resources)
				if errors.Is(err, store.ErrNodeFull) {
					req.Exclude, lastErr = append(req.Exclude, nodeID), err
					continue
				}
				return fail(err)
			}
		}
		placed = false
		err := s.build(ctx, sb, p)
		if err == nil {
			return nil
		}
		s.sched.Release(sb.API.Node, req.Resources)
		if !refusal(ctx, err) {
			return fail(err)
		}
		s.log.WarnContext(ctx, "node refused sandbox; trying another", "sandbox", sb.API.ID, "node", sb.API.Node,
			"tenant", sb.Tenant, "err", err)
		req.Exclude, lastErr = append(req.Exclude, sb.API.Node), err
		refused, refusedBy = err, sb.API.Node
	}
	return fail(fmt.Errorf("sandbox %s: %d nodes refused it, last: %w", sb.API.ID, len(req.Exclude), lastErr))
}

// recordFailed marks a create's record failed, which releases its
// charge. The record may have changed meanwhile (its node was declared
// down and the record lost): then it is read again and failed anyway.
func (s *Server) recordFailed(ctx context.Context, sb *store.Sandbox, cause error) {
	for range 3 {
		now := time.Now().UTC()
		sb.API.State, sb.API.Error, sb.DeletedAt = api.StateFailed, cause.Error(), &now
		err := s.store.UpdateSandbox(ctx, sb)
		if !errors.Is(err, store.ErrConflict) {
			if err != nil {
				s.log.ErrorContext(ctx, "record failed create", "sandbox", sb.API.ID, "err", err)
			}
			return
		}
		fresh, gerr := s.store.GetSandbox(ctx, sb.API.ID)
		if gerr != nil {
			s.log.ErrorContext(ctx, "record failed create", "sandbox", sb.API.ID, "err", gerr)
			return
		}
		sb.Version = fresh.Version
	}
}

// refusal reports whether a node's failure to build a sandbox is worth
// trying another node for: not when the request itself is bad, nor when
// the caller gave up.
func refusal(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	return !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, store.ErrConflict)
}

// build asks the sandbox's node to build it and records it running. On
// error the record is left creating (the caller moves or fails it) and
// nothing is left on the node.
func (s *Server) build(ctx context.Context, sb *store.Sandbox, p plan) error {
	n, err := s.nodes.get(sb.API.Node)
	if err != nil {
		return err
	}
	req := p.req
	net, files := policy.Effective(*req.Network, req.Phases, req.Phase)
	cctx, cancel := n.callCtx(ctx)
	_, err = n.client.Create(cctx, edge.CreateRequest{
		ID: sb.API.ID, Backend: nodeBackend(req.Backend), Layers: p.digests, Resources: req.Resources,
		Network: net, Files: files, NeedsNetwork: policy.NeedsNetwork(*req.Network, req.Phases),
		Env: req.Env, Phase: req.Phase,
	})
	if err != nil {
		// A node that went down cancels the call with its own cause; read
		// it before cancel(), which would make every cause "canceled" and
		// hide the node's own error.
		if cause := context.Cause(cctx); cause != nil && ctx.Err() == nil {
			err = cause
		}
	}
	cancel()
	if err != nil {
		// The node may have made it and the answer got lost: make sure
		// it does not stay there (a node that cannot be reached is
		// reconciled when it comes back).
		if !errors.Is(err, errdefs.ErrUnavailable) {
			go func() {
				dctx, cancel := n.callCtx(context.Background())
				defer cancel()
				dctx, cancel2 := context.WithTimeout(dctx, time.Minute)
				defer cancel2()
				n.client.Destroy(dctx, sb.API.ID)
			}()
		}
		return err
	}
	if err := s.recordRunning(ctx, sb); err != nil {
		// The node has it but we could not record it: undo, or it leaks.
		sb.API.State = api.StateCreating
		n.client.Destroy(context.WithoutCancel(ctx), sb.API.ID)
		return fmt.Errorf("record running sandbox: %w", err)
	}
	return nil
}

// recordRunning records a sandbox its node has just built as running. The
// record may have changed since it was read — a reconcile that found the
// sandbox on its node already marked it running, or a node declared down
// for a moment marked it lost — and is then read again: still live on the
// same node, it is recorded running; deleted or moved meanwhile, the
// conflict stands and the caller destroys what the node built.
func (s *Server) recordRunning(ctx context.Context, sb *store.Sandbox) error {
	want := *sb
	for range 3 {
		sb.API.State = api.StateRunning
		err := s.store.UpdateSandbox(ctx, sb)
		if !errors.Is(err, store.ErrConflict) {
			return err
		}
		fresh, gerr := s.store.GetSandbox(ctx, sb.API.ID)
		if gerr != nil {
			return err
		}
		switch {
		case fresh.DeletedAt != nil, fresh.API.Node != want.API.Node, fresh.Tenant != want.Tenant:
			return err
		case fresh.API.State != api.StateCreating && fresh.API.State != api.StateLost && fresh.API.State != api.StateRunning:
			return err
		}
		*sb = fresh
	}
	return fmt.Errorf("update sandbox %s: %w", sb.API.ID, store.ErrConflict)
}
