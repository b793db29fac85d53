package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/store"
)

// forkVM forks a microVM with its memory and processes: the copies are
// made on the parent's node (the saved memory is node-local) by its edge
// (edge.Fork: the guest's RAM and devices saved, each copy a VMM restored
// from them over a copy of the writable disk, with a new identity). The
// store places and charges the copies on that node in one transaction, so
// a node without room refuses the fork as a whole. No layer is made: the
// copies have the parent's layers.
func (s *Server) forkVM(w http.ResponseWriter, r *http.Request, req api.ForkRequest, parent store.Sandbox, n *node) error {
	tenant := parent.Tenant
	start := time.Now()
	forkID := "fk-" + randomID(10)
	ctx := context.WithoutCancel(r.Context())

	spec := restoreSpec(parent.API)
	layers := parent.API.Layers
	spec.Layers, spec.Snapshot = &layers, parent.API.Snapshot
	spec.Labels = map[string]string{}
	maps.Copy(spec.Labels, parent.API.Labels)
	for _, k := range serverLabels {
		delete(spec.Labels, k)
	}
	maps.Copy(spec.Labels, req.Labels)
	spec.Labels[api.LabelFork], spec.Labels[api.LabelForkOf] = forkID, parent.API.ID
	if req.TTLSeconds > 0 {
		spec.TTLSeconds = req.TTLSeconds
	}
	if req.TTLSeconds > int64(s.cfg.MaxTTL/time.Second) {
		return errdefs.Invalid("ttl_seconds over the maximum of %d", int64(s.cfg.MaxTTL.Seconds()))
	}
	if len(spec.Labels) > 64 {
		return errdefs.Invalid("at most 64 labels")
	}
	for k, v := range req.Labels {
		if !labelKeyRE.MatchString(k) || len(v) > 256 {
			return errdefs.Invalid("bad label %q: keys are [A-Za-z0-9._/-], up to 63 chars; values up to 256", k)
		}
	}
	p := plan{req: spec, digests: parent.LayerDigests}

	f := &fork{s: s, tenant: tenant, parent: parent, id: forkID}
	defer f.undo(ctx)
	var prefix []store.Step
	if req.Trajectory != nil {
		unlock, err := s.steps.lock(r.Context(), stepKey(tenant, req.Trajectory.ID))
		if err != nil {
			return err
		}
		defer unlock()
		if prefix, err = s.forkPrefix(ctx, parent, req); err != nil {
			return err
		}
	}

	now := time.Now().UTC()
	recs := make([]*store.Sandbox, req.Count)
	ids := make([]string, req.Count)
	for i := range recs {
		sb := s.newRecord(tenant, p, now)
		sb.API.Node = parent.API.Node
		recs[i] = &sb
	}
	err := s.store.PlaceSandboxes(ctx, recs)
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		for _, sb := range recs {
			sb.API.ID = sandboxID(time.Now())
		}
		err = s.store.PlaceSandboxes(ctx, recs)
	}
	if errors.Is(err, store.ErrNodeFull) {
		return fmt.Errorf("fork of %s: its node %s has no room for %d copies (a microVM's copies start on its node, from its memory): %w",
			parent.API.ID, parent.API.Node, req.Count, err)
	}
	if err != nil {
		return err
	}
	for i, sb := range recs {
		ids[i] = sb.API.ID
		s.sched.Charge(sb.API.Node, sb.API.Resources)
	}
	// The batch holds the records for undo: failed records are marked so
	// (releasing their charge), running ones destroyed.
	b := &batch{id: forkID, p: p, items: make([]api.BatchItem, req.Count), recs: recs}
	f.batch = b
	failAll := func(cause error) error {
		for _, sb := range recs {
			s.recordFailed(ctx, sb, cause)
			s.sched.Release(sb.API.Node, sb.API.Resources)
		}
		return cause
	}
	cctx, cancel := context.WithTimeout(ctx, createTimeoutFor(api.BackendMicroVM)+time.Duration(req.Count)*time.Minute)
	res, err := n.client.Fork(cctx, parent.API.ID, edge.ForkRequest{Copies: ids})
	cancel()
	if err != nil {
		if !errors.Is(err, errdefs.ErrUnavailable) {
			for _, id := range ids { // the answer may have been lost
				n.client.Destroy(ctx, id)
			}
		}
		return failAll(fmt.Errorf("fork of %s: %w", parent.API.ID, err))
	}
	for i, sb := range recs {
		sb.API.State = api.StateRunning
		if err := s.store.UpdateSandbox(ctx, sb); err != nil {
			for _, id := range ids[i:] {
				n.client.Destroy(ctx, id)
			}
			for _, sb := range recs[i:] {
				sb.API.State = api.StateCreating
				s.recordFailed(ctx, sb, err)
				s.sched.Release(sb.API.Node, sb.API.Resources)
			}
			return fmt.Errorf("fork of %s: record a copy running: %w", parent.API.ID, err)
		}
		b.items[i] = api.BatchItem{Index: i, ID: sb.API.ID, Node: sb.API.Node, State: api.StateRunning}
	}
	out := api.ForkResult{Fork: forkID, Parent: parent.API.ID, Memory: true}
	for _, sb := range recs {
		out.Sandboxes = append(out.Sandboxes, s.view(*sb))
	}
	if req.Trajectory != nil {
		if out.Trajectories, err = s.forkSteps(ctx, req, f, recs, prefix); err != nil {
			return err
		}
	}
	out.DurationMs = time.Since(start).Milliseconds()
	f.done = true
	s.log.Info("sandbox forked with memory", "tenant", tenant, "sandbox", parent.API.ID, "fork", forkID,
		"count", req.Count, "node", parent.API.Node, "edge", time.Duration(res.DurationMs)*time.Millisecond,
		"duration", time.Since(start), "steps", len(prefix))
	httpapi.WriteJSON(w, http.StatusCreated, out)
	return nil
}
