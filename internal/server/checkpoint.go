package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/trajectory"
)

// Trajectory checkpoints. A trajectory with checkpoint_every K has its
// sandbox snapshotted (pack_diff) after every step that is a multiple of
// K and runs there. The snapshot must show exactly the state after that
// step, yet the step's answer should not wait for it: the trainer thinks
// (a model generates the next action) while the node packs. So the answer
// goes out first, and until the snapshot is taken
//   - the trajectory's step lock is held, so no step of the trajectory —
//     run, replay or divergence — is decided;
//   - the sandbox's gate is closed, so every request that would act on the
//     sandbox (exec, files, processes, phase, reset, pause, resume,
//     snapshot) waits; deletes do not wait, and the checkpoint then fails.
// Both are taken before the answer is written, so nothing the client does
// after seeing it reaches the sandbox first. Requests already in flight
// and processes running in the background are not waited for: what they
// have written when the node freezes the sandbox is in the checkpoint,
// as with any snapshot.

// checkpointPrefix names checkpoint layers: checkpoint/<sandbox>:<step>-<attempt>.
const checkpointPrefix = "checkpoint/"

// DefaultCheckpointsKept is how many checkpoints a trajectory keeps.
const DefaultCheckpointsKept = 2

// checkpointTimeout bounds the snapshot of a checkpoint.
const checkpointTimeout = 10 * time.Minute

// gates holds back requests to sandboxes that are being checkpointed.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate
}

type gate struct {
	n    int           // checkpoints pending
	open chan struct{} // closed when n drops to 0
}

func newGates() *gates { return &gates{m: map[string]*gate{}} }

// hold closes the sandbox's gate until release is called.
func (g *gates) hold(id string) (release func()) {
	g.mu.Lock()
	gt := g.m[id]
	if gt == nil {
		gt = &gate{open: make(chan struct{})}
		g.m[id] = gt
	}
	gt.n++
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if gt.n--; gt.n == 0 {
				close(gt.open)
				delete(g.m, id)
			}
		})
	}
}

// wait returns once the sandbox's gate is open, and whether it waited.
func (g *gates) wait(ctx context.Context, id string) (bool, error) {
	g.mu.Lock()
	gt := g.m[id]
	g.mu.Unlock()
	if gt == nil {
		return false, nil
	}
	select {
	case <-gt.open:
		return true, nil
	case <-ctx.Done():
		return true, fmt.Errorf("wait for the checkpoint of sandbox %s: %w", id, ctx.Err())
	}
}

// afterCheckpoint waits for a checkpoint of the sandbox in progress and
// returns its record as it is then.
func (s *Server) afterCheckpoint(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	waited, err := s.gates.wait(ctx, sb.API.ID)
	if err != nil || !waited {
		return sb, err
	}
	return s.sandboxFor(ctx, sb.API.ID)
}

// setCheckpointEvery records a step's checkpoint_every as its trajectory's
// setting, if it changes it.
func (s *Server) setCheckpointEvery(ctx context.Context, tenant string, t *api.Trajectory) error {
	if t.CheckpointEvery == 0 {
		return nil
	}
	every := max(t.CheckpointEvery, 0) // trajectory.CheckpointsOff: none from now on
	cur, err := s.store.GetTrajectory(ctx, tenant, t.ID)
	if err == nil && cur.CheckpointEvery == every {
		return nil
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if err != nil && every == 0 {
		return nil // nothing to stop
	}
	return s.store.PutTrajectory(ctx, store.Trajectory{Tenant: tenant, ID: t.ID, CheckpointEvery: every,
		UpdatedAt: time.Now().UTC()})
}

// scheduleCheckpoint starts the checkpoint after step st if its
// trajectory asks for one there. It returns once the trajectory's lock and
// the sandbox's gate are held; the snapshot is taken in the background.
func (s *Server) scheduleCheckpoint(ctx context.Context, sb store.Sandbox, n *node, st store.Step) {
	if st.Step == 0 {
		return
	}
	// The step ran to its end even if its client left; so does this.
	tr, err := s.store.GetTrajectory(context.WithoutCancel(ctx), st.Tenant, st.Trajectory)
	if err != nil || tr.CheckpointEvery <= 0 || st.Step%tr.CheckpointEvery != 0 {
		return
	}
	log := s.log.With("tenant", st.Tenant, "trajectory", st.Trajectory, "step", st.Step, "sandbox", st.Sandbox)
	release := s.gates.hold(sb.API.ID)
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	unlock, err := s.steps.lock(lctx, stepKey(st.Tenant, st.Trajectory))
	cancel()
	if err != nil {
		release()
		log.WarnContext(ctx, "checkpoint skipped: the trajectory stayed locked", "err", err)
		s.metrics.checkpoints.WithLabelValues("skipped").Inc()
		return
	}
	go func() {
		defer release()
		defer unlock()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkpointTimeout)
		defer cancel()
		start := time.Now()
		c, err := s.checkpoint(ctx, sb, n, st)
		switch {
		case errors.Is(err, errSkipCheckpoint):
			log.InfoContext(ctx, "checkpoint skipped", "why", err)
			s.metrics.checkpoints.WithLabelValues("skipped").Inc()
		case err != nil:
			log.WarnContext(ctx, "checkpoint failed", "err", err)
			s.metrics.checkpoints.WithLabelValues("failed").Inc()
		default:
			log.InfoContext(ctx, "checkpoint taken", "layer", c.LayerName+":"+c.LayerTag, "size", c.Size,
				"duration", time.Since(start))
			s.metrics.checkpoints.WithLabelValues("ok").Inc()
			s.metrics.checkpointDur.Observe(time.Since(start).Seconds())
		}
	}()
}

var errSkipCheckpoint = errors.New("the sandbox no longer shows the state after the step")

// checkpoint snapshots the sandbox after step st and records it, then
// drops the trajectory's checkpoints beyond the number kept.
//
// Preconditions: the trajectory's lock and the sandbox's gate are held.
func (s *Server) checkpoint(ctx context.Context, sb store.Sandbox, n *node, st store.Step) (store.Checkpoint, error) {
	// The sandbox must show the effects of exactly the steps up to st,
	// all of them, so that a restore can replay every one: st is still
	// the recorded attempt, every earlier step is done and its effects are
	// here (it ran or replayed here, or was restored here), and no later
	// step ran here since. A trainer that skipped steps in this sandbox
	// gets no checkpoint.
	steps, err := s.store.ListSteps(ctx, st.Tenant, st.Trajectory)
	if err != nil {
		return store.Checkpoint{}, err
	}
	for _, o := range steps {
		here := o.Sandbox == st.Sandbox && o.Generation == st.Generation
		switch {
		case o.Step == st.Step && (o.Attempt != st.Attempt || o.State != api.StepDone):
			return store.Checkpoint{}, fmt.Errorf("step %d ran again: %w", st.Step, errSkipCheckpoint)
		case o.Step < st.Step && o.State != api.StepDone:
			return store.Checkpoint{}, fmt.Errorf("step %d is still running: %w", o.Step, errSkipCheckpoint)
		case o.Step < st.Step && !here:
			return store.Checkpoint{}, fmt.Errorf("step %d ran in sandbox %s, not here: %w", o.Step, o.Sandbox, errSkipCheckpoint)
		case o.Step > st.Step && here:
			return store.Checkpoint{}, fmt.Errorf("step %d ran after it: %w", o.Step, errSkipCheckpoint)
		}
	}
	cur, err := s.store.GetSandbox(ctx, sb.API.ID)
	if err != nil {
		return store.Checkpoint{}, err
	}
	if cur.API.State != api.StateRunning || cur.Generation != st.Generation {
		return store.Checkpoint{}, fmt.Errorf("sandbox is %s, generation %d: %w", cur.API.State, cur.Generation, errSkipCheckpoint)
	}
	spec, err := json.Marshal(restoreSpec(cur.API))
	if err != nil {
		return store.Checkpoint{}, err
	}
	l, err := s.pack(ctx, cur, n, checkpointPrefix+cur.API.ID, fmt.Sprintf("%d-%s", st.Step, st.Attempt))
	if err != nil {
		return store.Checkpoint{}, err
	}
	c := store.Checkpoint{
		Tenant: st.Tenant, Trajectory: st.Trajectory, Step: st.Step, Attempt: st.Attempt,
		LayerName: l.Name, LayerTag: l.Tag, Digest: l.Digest, Size: l.Size,
		Sandbox: cur.API.ID, Generation: cur.Generation, Spec: spec, CreatedAt: l.CreatedAt,
	}
	if err := s.store.AddCheckpoint(ctx, c); err != nil {
		return c, err
	}
	live, err := s.store.ListCheckpoints(ctx, st.Tenant, st.Trajectory)
	if err != nil {
		return c, err
	}
	for i := 0; i < len(live)-s.cfg.CheckpointsKept; i++ {
		if err := s.store.DropCheckpoint(ctx, live[i]); err != nil {
			return c, err
		}
	}
	if len(live) > s.cfg.CheckpointsKept {
		s.kickGC()
	}
	return c, nil
}

// restoreSpec is the create request that makes a sandbox like sb around a
// snapshot of it: same backend, resources, network, phases (in the phase
// it is in), lease, labels and environment.
func restoreSpec(sb api.Sandbox) api.CreateSandboxRequest {
	req := api.CreateSandboxRequest{
		Backend: sb.Backend, Resources: sb.Resources, Network: &sb.Network, Profile: sb.Profile, Phase: sb.Phase,
		TTLSeconds: sb.TTLSeconds, IdleTimeoutSeconds: sb.IdleTimeoutSeconds, Labels: sb.Labels, Env: sb.Env,
	}
	if req.Backend == api.BackendFnCall {
		req.Backend = api.BackendContainer // a sandbox taken from a pool is an ordinary container
	}
	if req.Profile == "" {
		req.Phases = sb.Phases
	}
	return req
}

func checkpointAPI(c store.Checkpoint) api.Checkpoint {
	return api.Checkpoint{
		Step: c.Step, Snapshot: c.LayerName + ":" + c.LayerTag, Digest: c.Digest, Size: c.Size,
		Sandbox: c.Sandbox, Generation: c.Generation, CreatedAt: c.CreatedAt,
	}
}

// restoreTrajectory recreates a trajectory's sandbox from a checkpoint: a
// new sandbox of the same spec starts from the snapshot, and the steps up
// to the checkpoint — all of whose effects the snapshot holds, see
// checkpoint — are recorded as being in the new one, so they replay
// there; later steps run.
func (s *Server) restoreTrajectory(w http.ResponseWriter, r *http.Request) error {
	var req api.RestoreRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if err := trajectory.ValidID(req.Trajectory); err != nil {
		return err
	}
	if req.Step < 0 || req.Step > trajectory.MaxStep {
		return errdefs.Invalid("step %d: want a checkpoint's step, or 0 for the newest", req.Step)
	}
	if req.TTLSeconds < 0 {
		return errdefs.Invalid("ttl_seconds must not be negative")
	}
	tenant := principalFrom(r.Context()).Tenant
	c, err := s.pickCheckpoint(r.Context(), tenant, req.Trajectory, req.Step)
	if err != nil {
		return err
	}
	var spec api.CreateSandboxRequest
	if err := json.Unmarshal(c.Spec, &spec); err != nil {
		return fmt.Errorf("checkpoint of %s at step %d: spec: %w", c.Trajectory, c.Step, err)
	}
	spec.Snapshot = c.LayerName + ":" + c.LayerTag
	if req.TTLSeconds > 0 {
		spec.TTLSeconds = req.TTLSeconds
	}
	p, err := s.validate(r.Context(), tenant, spec)
	if err != nil {
		return err
	}
	p.gone = r.Context().Done()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), p.wait+createTimeout)
	defer cancel()
	sb, err := s.create(ctx, tenant, p)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		s.destroy(ctx, sb)
		return err
	}
	moved, err := s.adoptSteps(ctx, c, sb)
	if err != nil {
		return fail(err)
	}
	if r.Context().Err() != nil {
		s.log.InfoContext(ctx, "client left during restore; destroying", "sandbox", sb.API.ID)
		return fail(r.Context().Err())
	}
	s.log.InfoContext(ctx, "trajectory restored from checkpoint", "tenant", tenant, "trajectory", c.Trajectory, "step", c.Step,
		"from", c.Sandbox, "sandbox", sb.API.ID, "steps_moved", moved)
	httpapi.WriteJSON(w, http.StatusCreated, api.RestoreResult{Sandbox: s.view(sb), Checkpoint: checkpointAPI(c)})
	return nil
}

// pickCheckpoint finds the live checkpoint at step (the newest for 0).
func (s *Server) pickCheckpoint(ctx context.Context, tenant, id string, step int64) (store.Checkpoint, error) {
	list, err := s.store.ListCheckpoints(ctx, tenant, id)
	if err != nil {
		return store.Checkpoint{}, err
	}
	for i := len(list) - 1; i >= 0; i-- {
		if step == 0 || list[i].Step == step {
			return list[i], nil
		}
	}
	if step != 0 {
		return store.Checkpoint{}, errdefs.NotFound("trajectory %s has no checkpoint at step %d", id, step)
	}
	return store.Checkpoint{}, errdefs.NotFound("trajectory %s has no checkpoint", id)
}

// adoptSteps records the checkpoint's steps as being in sb, if the
// checkpoint is still live: a step run meanwhile at or before it began
// another history.
func (s *Server) adoptSteps(ctx context.Context, c store.Checkpoint, sb store.Sandbox) (int, error) {
	unlock, err := s.steps.lock(ctx, stepKey(c.Tenant, c.Trajectory))
	if err != nil {
		return 0, err
	}
	defer unlock()
	list, err := s.store.ListCheckpoints(ctx, c.Tenant, c.Trajectory)
	if err != nil {
		return 0, err
	}
	for _, o := range list {
		if o.Step == c.Step && o.Attempt == c.Attempt {
			return s.store.MoveSteps(ctx, c.Tenant, c.Trajectory, c.Step,
				store.StepPlace{Sandbox: sb.API.ID, Generation: sb.Generation})
		}
	}
	return 0, fmt.Errorf("the checkpoint of %s at step %d was dropped during the restore (a step at or before it ran again): %w",
		c.Trajectory, c.Step, errdefs.ErrFailedPrecondition)
}
