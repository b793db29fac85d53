package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/trajectory"
)

// Fork: K copies of a sandbox's state now. The parent's node freezes it,
// copies its changes aside and thaws it at once (see edge.Copier), then
// packs the copy into a snapshot layer (pack_diff) in the shared store;
// the copies are a batch created from that snapshot, so they share the
// parent's layers and the fork layer's chunks: nothing is copied K times.
// Only the filesystem is carried: a container's processes and memory are
// not (that would need CRIU, which does not work on our kernels). A
// microVM's fork carries memory and processes too (see forkVM); full VMs
// are refused until theirs does.
//
// A fork is all or nothing: if any copy fails, the others are destroyed
// and the fork layer removed, and the error is the first copy's.

// forkLayerPrefix names fork layers: fork/<parent>:<fork id>.
const forkLayerPrefix = "fork/"

// serverLabels are set by the server on the sandboxes it makes; a
// request may not set them (a sandbox labelled as a pool's would be taken
// for one: guarded from direct use, destroyed at the next restart).
var serverLabels = []string{api.LabelBatch, api.LabelFork, api.LabelForkOf, api.LabelFnCallPool, labelBuild}

// checkServerLabels refuses a request's labels that the server sets.
func checkServerLabels(labels map[string]string) error {
	for _, k := range serverLabels {
		if _, ok := labels[k]; ok {
			return errdefs.Invalid("label %s is set by the server", k)
		}
	}
	return nil
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.ForkRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.Count < 1 || req.Count > api.MaxForkCount {
		return errdefs.Invalid("count %d: want 1 to %d copies", req.Count, api.MaxForkCount)
	}
	if err := checkServerLabels(req.Labels); err != nil {
		return err
	}
	if req.TTLSeconds < 0 {
		return errdefs.Invalid("ttl_seconds must not be negative")
	}
	if err := checkForkTrajectory(req); err != nil {
		return err
	}
	parent, err := s.sandboxFor(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if parent, err = s.afterCheckpoint(r.Context(), parent); err != nil {
		return err
	}
	switch parent.API.State {
	case api.StateRunning, api.StatePaused:
	case api.StateDeleted, api.StateFailed:
		return errdefs.NotFound("sandbox %s is %s", parent.API.ID, parent.API.State)
	default:
		return fmt.Errorf("sandbox %s is %s: %w", parent.API.ID, parent.API.State, errdefs.ErrFailedPrecondition)
	}
	if err := poolGuard(parent); err != nil {
		return err
	}
	n, err := s.nodes.get(parent.API.Node)
	if err != nil {
		return err
	}
	switch b := parent.API.Backend; b {
	case api.BackendContainer, api.BackendFnCall:
	case api.BackendMicroVM:
		return s.forkVM(w, r, req, parent, n)
	default:
		// A VM's fork must carry its memory; until a full VM's does,
		// refuse rather than hand back copies that rebooted.
		return fmt.Errorf("sandbox %s is a %s: fork takes containers and microVMs (snapshot it and create from the snapshot): %w",
			parent.API.ID, b, errdefs.ErrFailedPrecondition)
	}
	tenant := parent.Tenant
	start := time.Now()
	forkID := "fk-" + randomID(10)
	// Once the parent is frozen, see the fork through; a client that
	// leaves gets its copies destroyed (runBatch watches r.Context()).
	ctx := context.WithoutCancel(r.Context())

	f := &fork{s: s, tenant: tenant, parent: parent, id: forkID}
	defer f.undo(ctx)
	var prefix []store.Step
	lay, frozen, err := func() (store.Layer, time.Duration, error) {
		if req.Trajectory != nil {
			// No step of the trajectory is decided while the state is taken,
			// so the copied log matches the copied files.
			unlock, err := s.steps.lock(r.Context(), stepKey(tenant, req.Trajectory.ID))
			if err != nil {
				return store.Layer{}, 0, err
			}
			defer unlock()
			if prefix, err = s.forkPrefix(ctx, parent, req); err != nil {
				return store.Layer{}, 0, err
			}
		}
		return s.packAside(ctx, parent, n, forkLayerPrefix+parent.API.ID, forkID, true)
	}()
	if err != nil {
		return err
	}
	f.layer = &lay

	spec := restoreSpec(parent.API)
	spec.Snapshot = lay.Name + ":" + lay.Tag
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
	p, err := s.validate(ctx, tenant, spec)
	if err != nil {
		return err
	}
	b := &batch{id: forkID, p: p, items: make([]api.BatchItem, req.Count), recs: make([]*store.Sandbox, req.Count)}
	f.batch = b
	s.runBatch(ctx, r.Context(), tenant, b)
	for _, it := range b.items {
		if it.Error != nil {
			return fmt.Errorf("fork of %s: copy %d of %d: %w", parent.API.ID, it.Index+1, req.Count,
				errdefs.FromAPI(it.Error))
		}
	}
	if err := r.Context().Err(); err != nil {
		s.log.InfoContext(ctx, "client left during a fork; destroying its copies", "fork", forkID, "sandbox", parent.API.ID)
		return err
	}
	out := api.ForkResult{Fork: forkID, Parent: parent.API.ID, Layer: lay.Name + ":" + lay.Tag,
		PausedMs: frozen.Milliseconds()}
	for _, sb := range b.recs {
		out.Sandboxes = append(out.Sandboxes, s.view(*sb))
	}
	if req.Trajectory != nil {
		if out.Trajectories, err = s.forkSteps(ctx, req, f, b.recs, prefix); err != nil {
			return err
		}
	}
	out.DurationMs = time.Since(start).Milliseconds()
	f.done = true
	s.log.InfoContext(ctx, "sandbox forked", "tenant", tenant, "sandbox", parent.API.ID, "fork", forkID, "count", req.Count,
		"layer", out.Layer, "frozen", frozen, "duration", time.Since(start), "steps", len(prefix))
	httpapi.WriteJSON(w, http.StatusCreated, out)
	return nil
}

// fork is a fork in flight, for undoing it when it fails.
type fork struct {
	s      *Server
	tenant string
	parent store.Sandbox
	id     string
	layer  *store.Layer // set once packed
	batch  *batch       // set once the copies are being made
	// branches are the copies' trajectories written so far.
	branches []string
	done     bool
}

// undo destroys the copies made and removes the fork layer, unless the
// fork succeeded.
func (f *fork) undo(ctx context.Context) {
	if f.done {
		return
	}
	s := f.s
	for _, id := range f.branches {
		if _, err := s.store.DeleteSteps(ctx, f.tenant, id, 0); err != nil {
			s.log.WarnContext(ctx, "fork: drop the trajectory of a failed fork", "fork", f.id, "trajectory", id, "err", err)
		}
	}
	if f.batch != nil {
		s.destroyBatch(ctx, f.batch)
	}
	if f.layer == nil {
		return
	}
	l := f.layer
	if err := s.store.DeleteLayer(ctx, l.Tenant, l.Name, l.Tag, l.Digest); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.WarnContext(ctx, "fork: remove the layer of a failed fork", "fork", f.id, "layer", l.Name+":"+l.Tag, "err", err)
		return
	}
	s.layers.forget()
	if _, err := s.removeUnused(ctx, []string{l.Digest}); err != nil {
		s.log.WarnContext(ctx, "fork: remove the objects of a failed fork", "fork", f.id, "digest", l.Digest, "err", err)
	}
}

// checkForkTrajectory validates the trajectory part of a fork request.
func checkForkTrajectory(req api.ForkRequest) error {
	t := req.Trajectory
	if t == nil {
		return nil
	}
	if err := trajectory.ValidID(t.ID); err != nil {
		return err
	}
	if t.IDs == nil {
		return nil
	}
	if len(t.IDs) != req.Count {
		return errdefs.Invalid("trajectory.ids has %d ids for %d copies", len(t.IDs), req.Count)
	}
	seen := map[string]bool{t.ID: true}
	for _, id := range t.IDs {
		if err := trajectory.ValidID(id); err != nil {
			return err
		}
		if seen[id] {
			return errdefs.Invalid("trajectory id %s is given twice (or is the parent's)", id)
		}
		seen[id] = true
	}
	return nil
}

// forkPrefix reads the steps of the parent's trajectory whose effects are
// in the parent now: the leading run of done steps that ran (or were
// restored) there since its last reset. A step running now, or one that
// ran elsewhere, ends the prefix; the copies run it and what follows.
//
// Preconditions: the trajectory's lock is held.
func (s *Server) forkPrefix(ctx context.Context, parent store.Sandbox, req api.ForkRequest) ([]store.Step, error) {
	tenant, id := parent.Tenant, req.Trajectory.ID
	list, err := s.store.ListSteps(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, errdefs.NotFound("trajectory %s has no steps", id)
	}
	for i := range req.Count {
		bid := branchID(req, "", i)
		if bid == "" {
			break
		}
		if got, err := s.store.ListSteps(ctx, tenant, bid); err != nil {
			return nil, err
		} else if len(got) > 0 {
			return nil, fmt.Errorf("trajectory %s already has steps: %w", bid, errdefs.ErrAlreadyExists)
		}
	}
	var prefix []store.Step
	for _, st := range list {
		if st.State != api.StepDone || st.Sandbox != parent.API.ID || st.Generation != parent.Generation {
			break
		}
		full, err := s.store.GetStep(ctx, tenant, id, st.Step)
		if err != nil {
			return nil, err
		}
		prefix = append(prefix, full)
	}
	return prefix, nil
}

// branchID is copy i's trajectory id: the one asked for, or
// <id>/<fork>.<i> ("" while the fork has no id).
func branchID(req api.ForkRequest, forkID string, i int) string {
	if t := req.Trajectory; t.IDs != nil {
		return t.IDs[i]
	}
	if forkID == "" {
		return ""
	}
	return req.Trajectory.ID + "/" + forkID + "." + strconv.Itoa(i)
}

// forkSteps records the prefix as done steps of every copy's trajectory,
// in that copy: a replay of them there answers from the log.
func (s *Server) forkSteps(ctx context.Context, req api.ForkRequest, f *fork, copies []*store.Sandbox,
	prefix []store.Step) ([]api.ForkedTrajectory, error) {
	tenant := copies[0].Tenant
	settings, err := s.store.GetTrajectory(ctx, tenant, req.Trajectory.ID)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	out := make([]api.ForkedTrajectory, len(copies))
	for i, sb := range copies {
		id := branchID(req, f.id, i)
		f.branches = append(f.branches, id)
		for _, st := range prefix {
			now := time.Now().UTC()
			st.Trajectory, st.Attempt = id, randomID(16)
			st.Sandbox, st.Generation = sb.API.ID, sb.Generation
			if err := s.store.BeginStep(ctx, st); err != nil {
				return nil, fmt.Errorf("fork trajectory %s into %s: %w", req.Trajectory.ID, id, err)
			}
			if st.RecordedAt == nil {
				st.RecordedAt = &now
			}
			if err := s.store.FinishStep(ctx, st); err != nil {
				return nil, fmt.Errorf("fork trajectory %s into %s: %w", req.Trajectory.ID, id, err)
			}
		}
		if settings.CheckpointEvery > 0 {
			t := store.Trajectory{Tenant: tenant, ID: id, CheckpointEvery: settings.CheckpointEvery, UpdatedAt: time.Now().UTC()}
			if err := s.store.PutTrajectory(ctx, t); err != nil {
				return nil, err
			}
		}
		out[i] = api.ForkedTrajectory{ID: id, ForkFrom: req.Trajectory.ID, Sandbox: sb.API.ID, Steps: len(prefix)}
	}
	return out, nil
}
