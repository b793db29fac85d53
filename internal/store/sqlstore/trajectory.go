package sqlstore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// StepCols are the columns a new step is inserted with (all but the
// result and the replay count, which starts at 0).
const StepCols = `tenant, trajectory, step, fingerprint, attempt, sandbox, generation, state, exit_code, started_at, recorded_at`

// StepReadCols are the columns ScanStep reads.
const StepReadCols = StepCols + `, replays, replayed_at`

// ScanStep reads a step from a row of StepReadCols and, if result is
// not nil, the result column after them (nil where NULL).
func ScanStep(sc Scanner, result *[]byte) (store.Step, error) {
	var st store.Step
	var exit *int32
	var started int64
	var recorded, replayed *int64
	dest := []any{&st.Tenant, &st.Trajectory, &st.Step, &st.Fingerprint, &st.Attempt, &st.Sandbox,
		&st.Generation, &st.State, &exit, &started, &recorded, &st.Replays, &replayed}
	if result != nil {
		dest = append(dest, result)
	}
	if err := sc.Scan(dest...); err != nil {
		return st, err
	}
	if exit != nil {
		c := int(*exit)
		st.ExitCode = &c
	}
	st.StartedAt = FromNanos(started)
	if recorded != nil {
		t := FromNanos(*recorded)
		st.RecordedAt = &t
	}
	if replayed != nil {
		t := FromNanos(*replayed)
		st.ReplayedAt = &t
	}
	return st, nil
}

// StepResult decodes a result column read by ScanStep (nil: none yet).
func StepResult(result []byte) (*api.ExecResult, error) {
	if result == nil {
		return nil, nil
	}
	r := new(api.ExecResult)
	if err := json.Unmarshal(result, r); err != nil {
		return nil, fmt.Errorf("decode trajectory step result: %w", err)
	}
	return r, nil
}

// The trajectory log.
const (
	StepGet = `SELECT ` + StepReadCols + `, result FROM trajectory_steps
		WHERE tenant = ? AND trajectory = ? AND step = ?`
	StepList = `SELECT ` + StepReadCols + ` FROM trajectory_steps
		WHERE tenant = ? AND trajectory = ? ORDER BY step`
	// StepReplayed counts a replay of a done step, if it is still the
	// recorded attempt (StepReplayedArgs).
	StepReplayed = `UPDATE trajectory_steps SET replays = replays + 1, replayed_at = ?
		WHERE tenant = ? AND trajectory = ? AND step = ? AND attempt = ? AND state = ?`
	// StepsDelete deletes a trajectory's steps from a step on.
	StepsDelete = `DELETE FROM trajectory_steps WHERE tenant = ? AND trajectory = ? AND step >= ?`
	// StepsMove moves a trajectory's done steps up to a step to another
	// sandbox (StepsMoveArgs).
	StepsMove = `UPDATE trajectory_steps SET sandbox = ?, generation = ?
		WHERE tenant = ? AND trajectory = ? AND step <= ? AND state = ?`
	// TrajectoriesPurge deletes the steps of the trajectories whose last
	// step started before a time.
	TrajectoriesPurge = `DELETE FROM trajectory_steps WHERE (tenant, trajectory) IN (
		SELECT tenant, trajectory FROM trajectory_steps GROUP BY tenant, trajectory HAVING MAX(started_at) < ?)`
	// TrajectorySettingsPurge deletes the settings of trajectories left
	// without steps, updated before a time.
	TrajectorySettingsPurge = `DELETE FROM trajectories WHERE updated_at < ? AND NOT EXISTS (
		SELECT 1 FROM trajectory_steps t WHERE t.tenant = trajectories.tenant AND t.trajectory = trajectories.id)`
	TrajectoryPut = `INSERT INTO trajectories (tenant, id, checkpoint_every, updated_at)
		VALUES (?, ?, ?, ?) ON CONFLICT (tenant, id) DO UPDATE SET
		checkpoint_every = excluded.checkpoint_every, updated_at = excluded.updated_at`
	TrajectoryGet = `SELECT checkpoint_every, updated_at FROM trajectories WHERE tenant = ? AND id = ?`
)

// StepReplayedArgs are StepReplayed's arguments for st, replayed at.
func StepReplayedArgs(st store.Step, at time.Time) []any {
	return []any{Nanos(at), st.Tenant, st.Trajectory, st.Step, st.Attempt, api.StepDone}
}

// StepsMoveArgs are StepsMove's arguments.
func StepsMoveArgs(tenant, trajectory string, upTo int64, to store.StepPlace) []any {
	return []any{to.Sandbox, to.Generation, tenant, trajectory, upTo, api.StepDone}
}

// TrajectoryArgs are TrajectoryPut's arguments for t.
func TrajectoryArgs(t store.Trajectory) []any {
	return []any{t.Tenant, t.ID, t.CheckpointEvery, Nanos(t.UpdatedAt)}
}

// ScanTrajectory reads a row of TrajectoryGet into t.
func ScanTrajectory(sc Scanner, t *store.Trajectory) error {
	var updated int64
	err := sc.Scan(&t.CheckpointEvery, &updated)
	t.UpdatedAt = FromNanos(updated)
	return err
}

// StepInsert records a running step; StepInsertArgs are its arguments.
const StepInsert = `INSERT INTO trajectory_steps (` + StepCols + `, result)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, NULL, NULL)`

// StepInsertArgs are StepInsert's arguments for st.
func StepInsertArgs(st store.Step) []any {
	return []any{st.Tenant, st.Trajectory, st.Step, st.Fingerprint, st.Attempt, st.Sandbox, st.Generation,
		api.StepRunning, Nanos(st.StartedAt)}
}

// StepFinish records a running attempt's result; it changes no row if
// the step is no longer that attempt, running.
const StepFinish = `UPDATE trajectory_steps SET state = ?, exit_code = ?, result = ?, recorded_at = ?
	WHERE tenant = ? AND trajectory = ? AND step = ? AND attempt = ? AND state = ?`

// StepFinishArgs are StepFinish's arguments for st, which must carry
// its result.
func StepFinishArgs(st store.Step) ([]any, error) {
	if st.Result == nil {
		return nil, errdefs.Invalid("finish trajectory step %d without a result", st.Step)
	}
	doc, err := json.Marshal(st.Result)
	if err != nil {
		return nil, fmt.Errorf("encode trajectory step result: %w", err)
	}
	recorded := time.Now()
	if st.RecordedAt != nil {
		recorded = *st.RecordedAt
	}
	return []any{api.StepDone, st.Result.ExitCode, string(doc), Nanos(recorded),
		st.Tenant, st.Trajectory, st.Step, st.Attempt, api.StepRunning}, nil
}

// CheckpointCols are the columns ScanCheckpoint reads, of a checkpoint
// row named c.
const CheckpointCols = `c.tenant, c.trajectory, c.step, c.attempt, c.layer_name, c.layer_tag, c.digest, c.size,
	c.sandbox, c.generation, c.spec, c.created_at, c.dropped`

// LiveCheckpoint is the condition for a checkpoint row c to be live: not
// dropped, and its step still recorded, done, as the same attempt.
const LiveCheckpoint = `NOT c.dropped AND EXISTS (SELECT 1 FROM trajectory_steps t WHERE t.tenant = c.tenant
	AND t.trajectory = c.trajectory AND t.step = c.step AND t.attempt = c.attempt AND t.state = '` + api.StepDone + `')`

// Checkpoints. A new one is not dropped (the column's default).
const (
	CheckpointInsert = `INSERT INTO trajectory_checkpoints (tenant, trajectory, step, attempt,
		layer_name, layer_tag, digest, size, sandbox, generation, spec, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	CheckpointList = `SELECT ` + CheckpointCols + ` FROM trajectory_checkpoints c
		WHERE c.tenant = ? AND c.trajectory = ? AND ` + LiveCheckpoint + ` ORDER BY c.step`
	// CheckpointsDead lists the checkpoints that are not live, oldest
	// first, up to a limit.
	CheckpointsDead = `SELECT ` + CheckpointCols + ` FROM trajectory_checkpoints c
		WHERE NOT (` + LiveCheckpoint + `) ORDER BY c.created_at LIMIT ?`
	// CheckpointDrop marks a checkpoint dropped (CheckpointDropArgs).
	CheckpointDrop = `UPDATE trajectory_checkpoints SET dropped = ?
		WHERE tenant = ? AND trajectory = ? AND step = ? AND attempt = ?`
	CheckpointDelete = `DELETE FROM trajectory_checkpoints
		WHERE tenant = ? AND trajectory = ? AND step = ? AND attempt = ?`
)

// CheckpointArgs are CheckpointInsert's arguments for c.
func CheckpointArgs(c store.Checkpoint) []any {
	return []any{c.Tenant, c.Trajectory, c.Step, c.Attempt, c.LayerName, c.LayerTag, c.Digest, c.Size,
		c.Sandbox, c.Generation, string(c.Spec), Nanos(c.CreatedAt)}
}

// CheckpointKey are CheckpointDelete's arguments for c.
func CheckpointKey(c store.Checkpoint) []any { return []any{c.Tenant, c.Trajectory, c.Step, c.Attempt} }

// CheckpointDropArgs are CheckpointDrop's arguments for c.
func CheckpointDropArgs(c store.Checkpoint) []any { return append([]any{true}, CheckpointKey(c)...) }

// ScanCheckpoint reads a checkpoint from a row of CheckpointCols.
func ScanCheckpoint(sc Scanner) (store.Checkpoint, error) {
	var c store.Checkpoint
	var spec string
	var created int64
	err := sc.Scan(&c.Tenant, &c.Trajectory, &c.Step, &c.Attempt, &c.LayerName, &c.LayerTag, &c.Digest,
		&c.Size, &c.Sandbox, &c.Generation, &spec, &created, &c.Dropped)
	c.Spec, c.CreatedAt = []byte(spec), FromNanos(created)
	return c, err
}
