package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/trajectory"
)

// steps coordinates the trajectory steps of this server: a lock per
// trajectory, held only while a step is decided and begun, and the steps
// running here (by attempt), so that a request for a step in flight waits
// for it instead of running it again.
type steps struct {
	mu      sync.Mutex
	locks   map[string]*stepLock
	running map[string]chan struct{} // attempt → closed when it settles
}

type stepLock struct {
	ch   chan struct{} // holds a token while locked
	refs int
}

func newSteps() *steps {
	return &steps{locks: map[string]*stepLock{}, running: map[string]chan struct{}{}}
}

// lock takes the lock of a trajectory, or gives up when ctx ends.
func (t *steps) lock(ctx context.Context, key string) (unlock func(), err error) {
	t.mu.Lock()
	l := t.locks[key]
	if l == nil {
		l = &stepLock{ch: make(chan struct{}, 1)}
		t.locks[key] = l
	}
	l.refs++
	t.mu.Unlock()
	release := func() {
		t.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(t.locks, key)
		}
		t.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// start records that attempt runs (or is being settled) here; done ends it.
func (t *steps) start(attempt string) (done func()) {
	ch := make(chan struct{})
	t.mu.Lock()
	t.running[attempt] = ch
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		delete(t.running, attempt)
		t.mu.Unlock()
		close(ch)
	}
}

// runningHere returns a channel closed when attempt settles, or nil if it
// does not run in this server.
func (t *steps) runningHere(attempt string) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.running[attempt]
}

func stepKey(tenant, id string) string { return tenant + "\x00" + id }

// execStep runs an exec that carries a trajectory: it answers from the log
// when the same command already ran at that step in this sandbox, and
// otherwise runs it, records the result durably and only then answers.
// The command runs to its end even if the client goes away, so that a
// trainer that died mid-step finds the result when it replays.
//
// With Accept: application/x-ndjson a step that runs streams its output
// live; a replayed one sends its recorded output as events, then the exit.
func (s *Server) execStep(w http.ResponseWriter, r *http.Request, req *api.ExecRequest) error {
	if err := trajectory.CheckExec(req); err != nil {
		return err
	}
	plain := *req
	plain.Trajectory = nil
	if err := agent.CheckExec(&plain); err != nil {
		return err
	}
	fp, err := trajectory.Fingerprint(req)
	if err != nil {
		return err
	}
	sb, n, err := s.liveSandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	defer s.begin(r.Context(), sb)()
	var out *ndjsonOut
	var live func(api.ExecEvent)
	if acceptsNDJSON(r) {
		out = newNDJSONOut(w)
		live = out.send
	}
	res, err := s.step(r.Context(), sb, n, req, fp, live)
	switch {
	case err != nil && out != nil && out.started():
		out.send(api.ExecEvent{Error: eventError(err)})
		return nil
	case err != nil:
		return err
	case out == nil:
		httpapi.WriteJSON(w, http.StatusOK, res)
		return nil
	}
	if res.Replayed {
		out.replay(res)
	}
	exit := *res
	exit.Stdout, exit.Stderr, exit.Encoding = "", "", ""
	out.send(api.ExecEvent{Exit: &exit})
	return nil
}

// step decides what to do with a step and does it; see trajectory.Decide.
func (s *Server) step(ctx context.Context, sb store.Sandbox, n *node, req *api.ExecRequest, fp string,
	live func(api.ExecEvent)) (*api.ExecResult, error) {
	traj := req.Trajectory
	here := trajectory.Place{Sandbox: sb.API.ID, Generation: sb.Generation}
	key := stepKey(sb.Tenant, traj.ID)
	log := s.log.With("tenant", sb.Tenant, "sandbox", sb.API.ID, "trajectory", traj.ID, "step", traj.Step)
	if err := s.setCheckpointEvery(ctx, sb.Tenant, traj); err != nil {
		return nil, err
	}
	for range 4 {
		unlock, err := s.steps.lock(ctx, key)
		if err != nil {
			return nil, err
		}
		var rec *store.Step
		got, err := s.store.GetStep(ctx, sb.Tenant, traj.ID, traj.Step)
		switch {
		case err == nil:
			rec = &got
		case !errors.Is(err, errdefs.ErrNotFound):
			unlock()
			return nil, err
		}
		act := trajectory.Decide(rec, fp, here)
		s.metrics.steps.WithLabelValues(act.String()).Inc()
		switch act {
		case trajectory.Replay:
			unlock()
			if err := s.store.StepReplayed(ctx, *rec, time.Now()); err != nil {
				log.WarnContext(ctx, "count the step's replay", "err", err)
			}
			res := *rec.Result
			res.Replayed = true
			return &res, nil
		case trajectory.Settle:
			if ch := s.steps.runningHere(rec.Attempt); ch != nil {
				unlock()
				select {
				case <-ch:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				continue
			}
			done := s.steps.start(rec.Attempt)
			unlock()
			err := s.settle(ctx, *rec)
			done()
			if err != nil {
				return nil, err
			}
		default:
			st := store.Step{
				Tenant: sb.Tenant, Trajectory: traj.ID, Step: traj.Step, Fingerprint: fp,
				Attempt: randomID(16), Sandbox: sb.API.ID, Generation: sb.Generation, StartedAt: time.Now().UTC(),
			}
			if err := s.store.BeginStep(ctx, st); err != nil {
				unlock()
				return nil, err
			}
			done := s.steps.start(st.Attempt)
			unlock()
			if act != trajectory.Run {
				log.InfoContext(ctx, "trajectory step runs again", "action", act.String())
				s.kickGC() // checkpoints after this step are dead now
			}
			res, err := s.runStep(ctx, n, req, st, live)
			done()
			if err == nil {
				s.scheduleCheckpoint(ctx, sb, n, st)
			}
			return res, err
		}
	}
	return nil, fmt.Errorf("trajectory %s step %d did not settle: %w", traj.ID, traj.Step, errdefs.ErrUnavailable)
}

// runStep runs a begun step in its sandbox and records its result before
// returning it. The run is detached from the request: it ends with the
// command (its timeout bounds it), not with the client.
func (s *Server) runStep(ctx context.Context, n *node, req *api.ExecRequest, st store.Step,
	live func(api.ExecEvent)) (*api.ExecResult, error) {
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	if timeout == 0 {
		timeout = defaultExecTimeout
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout+2*time.Minute)
	defer cancel()
	res, pid, err := s.startAndCollect(ctx, n, st.Sandbox, req, stepTag(st.Attempt), live)
	if errors.Is(err, errNotStarted) {
		s.dropStep(ctx, st)
		return nil, err
	}
	if err != nil {
		// The command may be running: the step stays recorded as running,
		// and the next request for it finds the process by its tag.
		return nil, err
	}
	if err := s.finishStep(ctx, n, st, pid, res); err != nil {
		return nil, err
	}
	return res, nil
}

// finishStep records a step's result, then forgets its process in the
// sandbox. In that order: if the record fails, the process is still there
// for the next request to find.
func (s *Server) finishStep(ctx context.Context, n *node, st store.Step, pid string, res *api.ExecResult) error {
	now := time.Now().UTC()
	st.Result, st.RecordedAt = res, &now
	err := s.store.FinishStep(ctx, st)
	switch {
	case errors.Is(err, store.ErrConflict):
		s.log.WarnContext(ctx, "trajectory step was dropped while it ran (a divergence at an earlier step, or a delete); its result is not recorded",
			"tenant", st.Tenant, "trajectory", st.Trajectory, "step", st.Step, "sandbox", st.Sandbox)
	case err != nil:
		return fmt.Errorf("record trajectory %s step %d: %w", st.Trajectory, st.Step, err)
	}
	go func() { // after the answer: nothing waits on it
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := n.client.AgentJSON(ctx, st.Sandbox, http.MethodDelete, "/procs/"+pid, nil, nil, nil); err != nil {
			s.log.DebugContext(ctx, "forget step process", "sandbox", st.Sandbox, "process", pid, "err", err)
		}
	}()
	return nil
}

// settle finishes a step recorded as running that no request of this
// server runs: its server died while it ran. The command ran in the
// sandbox's agent, which outlives servers, as a process tagged with the
// attempt: if it is there, its result is taken (waiting for it to end);
// if not, it never started (or the sandbox restarted under it), and the
// step is dropped so that it runs.
func (s *Server) settle(ctx context.Context, rec store.Step) error {
	log := s.log.With("tenant", rec.Tenant, "trajectory", rec.Trajectory, "step", rec.Step, "sandbox", rec.Sandbox)
	owner, err := s.store.GetSandbox(ctx, rec.Sandbox)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if err != nil || owner.Tenant != rec.Tenant || owner.DeletedAt != nil || owner.Generation != rec.Generation {
		log.InfoContext(ctx, "trajectory step was running in a sandbox that is gone or was reset; it will run again")
		return s.dropStep(ctx, rec)
	}
	switch owner.API.State {
	case api.StateRunning:
	case api.StatePaused:
		return fmt.Errorf("trajectory %s step %d is running in sandbox %s, which is paused: %w",
			rec.Trajectory, rec.Step, rec.Sandbox, errdefs.ErrFailedPrecondition)
	default:
		return fmt.Errorf("trajectory %s step %d is running in sandbox %s, which is %s: %w",
			rec.Trajectory, rec.Step, rec.Sandbox, owner.API.State, errdefs.ErrUnavailable)
	}
	n, err := s.nodes.get(owner.API.Node)
	if err != nil {
		return err
	}
	var procs api.ProcessList
	if err := n.client.AgentJSON(ctx, rec.Sandbox, http.MethodGet, "/procs", nil, nil, &procs); err != nil {
		return fmt.Errorf("find trajectory %s step %d: %w", rec.Trajectory, rec.Step, err)
	}
	tag := stepTag(rec.Attempt)
	for _, p := range procs.Processes {
		if p.Tag != tag {
			continue
		}
		log.InfoContext(ctx, "trajectory step outlived its server; taking its result", "process", p.ID, "running", p.Running)
		res, err := s.collect(ctx, n, rec.Sandbox, p.ID, nil)
		if err != nil {
			return err
		}
		return s.finishStep(ctx, n, rec, p.ID, res)
	}
	log.WarnContext(ctx, "trajectory step was recorded as running but its process is not in the sandbox (it never started, or the sandbox restarted); it will run again")
	return s.dropStep(ctx, rec)
}

// dropStep removes a step recorded as running if it is still that attempt.
func (s *Server) dropStep(ctx context.Context, st store.Step) error {
	unlock, err := s.steps.lock(ctx, stepKey(st.Tenant, st.Trajectory))
	if err != nil {
		return err
	}
	defer unlock()
	cur, err := s.store.GetStep(ctx, st.Tenant, st.Trajectory, st.Step)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && cur.Attempt != st.Attempt) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = s.store.DeleteSteps(ctx, st.Tenant, st.Trajectory, st.Step)
	return err
}

func (s *Server) getTrajectory(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := trajectory.ValidID(id); err != nil {
		return err
	}
	tenant := principalFrom(r.Context()).Tenant
	list, err := s.store.ListSteps(r.Context(), tenant, id)
	if err != nil {
		return err
	}
	settings, err := s.store.GetTrajectory(r.Context(), tenant, id)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	ckpts, err := s.store.ListCheckpoints(r.Context(), tenant, id)
	if err != nil {
		return err
	}
	if len(list) == 0 && len(ckpts) == 0 && settings.CheckpointEvery == 0 {
		return errdefs.NotFound("trajectory %s", id)
	}
	out := api.TrajectoryLog{ID: id, Steps: make([]api.TrajectoryStep, 0, len(list)), CheckpointEvery: settings.CheckpointEvery}
	for _, c := range ckpts {
		out.Checkpoints = append(out.Checkpoints, checkpointAPI(c))
	}
	for _, st := range list {
		out.Steps = append(out.Steps, api.TrajectoryStep{
			Step: st.Step, Fingerprint: st.Fingerprint, Sandbox: st.Sandbox, State: st.State,
			ExitCode: st.ExitCode, StartedAt: st.StartedAt, RecordedAt: st.RecordedAt,
			Replays: st.Replays, ReplayedAt: st.ReplayedAt,
		})
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// deleteTrajectory drops a trajectory's steps from from_step on (all of
// them by default). It is idempotent.
func (s *Server) deleteTrajectory(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := trajectory.ValidID(id); err != nil {
		return err
	}
	var from int64
	if v := r.URL.Query().Get("from_step"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return errdefs.Invalid("from_step %q: want a step number", v)
		}
		from = n
	}
	tenant := principalFrom(r.Context()).Tenant
	unlock, err := s.steps.lock(r.Context(), stepKey(tenant, id))
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := s.store.DeleteSteps(r.Context(), tenant, id, from); err != nil {
		return err
	}
	if from <= 0 { // the whole trajectory goes, its settings too
		if cur, err := s.store.GetTrajectory(r.Context(), tenant, id); err == nil && cur.CheckpointEvery != 0 {
			cur.CheckpointEvery, cur.UpdatedAt = 0, time.Now().UTC()
			if err := s.store.PutTrajectory(r.Context(), cur); err != nil {
				return err
			}
		}
	}
	s.kickGC() // checkpoints at the dropped steps are dead
	w.WriteHeader(http.StatusNoContent)
	return nil
}
