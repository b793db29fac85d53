package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// PutTrajectory implements store.Store.
func (s *Store) PutTrajectory(ctx context.Context, t store.Trajectory) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO trajectories (tenant, id, checkpoint_every, updated_at)
		VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, id) DO UPDATE SET
		checkpoint_every = excluded.checkpoint_every, updated_at = excluded.updated_at`,
		t.Tenant, t.ID, t.CheckpointEvery, nanos(t.UpdatedAt))
	if err != nil {
		return fmt.Errorf("put trajectory: %w", err)
	}
	return nil
}

// GetTrajectory implements store.Store.
func (s *Store) GetTrajectory(ctx context.Context, tenant, id string) (store.Trajectory, error) {
	t := store.Trajectory{Tenant: tenant, ID: id}
	var updated int64
	err := s.pool.QueryRow(ctx, `SELECT checkpoint_every, updated_at FROM trajectories WHERE tenant = $1 AND id = $2`,
		tenant, id).Scan(&t.CheckpointEvery, &updated)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, errdefs.NotFound("trajectory %s", id)
	}
	if err != nil {
		return t, fmt.Errorf("get trajectory: %w", err)
	}
	t.UpdatedAt = fromNanos(updated)
	return t, nil
}

const checkpointCols = `c.tenant, c.trajectory, c.step, c.attempt, c.layer_name, c.layer_tag, c.digest, c.size,
	c.sandbox, c.generation, c.spec, c.created_at, c.dropped`

// live is the condition for a checkpoint row c to be live: not dropped,
// and its step still recorded, done, as the same attempt.
const live = `NOT c.dropped AND EXISTS (SELECT 1 FROM trajectory_steps t WHERE t.tenant = c.tenant
	AND t.trajectory = c.trajectory AND t.step = c.step AND t.attempt = c.attempt AND t.state = '` + api.StepDone + `')`

func scanCheckpoint(r pgx.CollectableRow) (store.Checkpoint, error) {
	var c store.Checkpoint
	var spec string
	var created int64
	err := r.Scan(&c.Tenant, &c.Trajectory, &c.Step, &c.Attempt, &c.LayerName, &c.LayerTag, &c.Digest,
		&c.Size, &c.Sandbox, &c.Generation, &spec, &created, &c.Dropped)
	c.Spec, c.CreatedAt = []byte(spec), fromNanos(created)
	return c, err
}

// AddCheckpoint implements store.Store.
func (s *Store) AddCheckpoint(ctx context.Context, c store.Checkpoint) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO trajectory_checkpoints (tenant, trajectory, step, attempt,
		layer_name, layer_tag, digest, size, sandbox, generation, spec, created_at, dropped)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, FALSE)`,
		c.Tenant, c.Trajectory, c.Step, c.Attempt, c.LayerName, c.LayerTag, c.Digest, c.Size,
		c.Sandbox, c.Generation, string(c.Spec), nanos(c.CreatedAt))
	if isUnique(err) {
		return fmt.Errorf("checkpoint of trajectory %s at step %d: %w", c.Trajectory, c.Step, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("add checkpoint: %w", err)
	}
	return nil
}

func (s *Store) queryCheckpoints(ctx context.Context, what, q string, args ...any) ([]store.Checkpoint, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, scanCheckpoint)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// ListCheckpoints implements store.Store.
func (s *Store) ListCheckpoints(ctx context.Context, tenant, trajectory string) ([]store.Checkpoint, error) {
	return s.queryCheckpoints(ctx, "list checkpoints", `SELECT `+checkpointCols+` FROM trajectory_checkpoints c
		WHERE c.tenant = $1 AND c.trajectory = $2 AND `+live+` ORDER BY c.step`, tenant, trajectory)
}

// DeadCheckpoints implements store.Store.
func (s *Store) DeadCheckpoints(ctx context.Context, limit int) ([]store.Checkpoint, error) {
	return s.queryCheckpoints(ctx, "list dead checkpoints", `SELECT `+checkpointCols+` FROM trajectory_checkpoints c
		WHERE NOT (`+live+`) ORDER BY c.created_at LIMIT $1`, limit)
}

// DropCheckpoint implements store.Store.
func (s *Store) DropCheckpoint(ctx context.Context, c store.Checkpoint) error {
	_, err := s.pool.Exec(ctx, `UPDATE trajectory_checkpoints SET dropped = TRUE
		WHERE tenant = $1 AND trajectory = $2 AND step = $3 AND attempt = $4`, c.Tenant, c.Trajectory, c.Step, c.Attempt)
	if err != nil {
		return fmt.Errorf("drop checkpoint: %w", err)
	}
	return nil
}

// DeleteCheckpoint implements store.Store.
func (s *Store) DeleteCheckpoint(ctx context.Context, c store.Checkpoint) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM trajectory_checkpoints
		WHERE tenant = $1 AND trajectory = $2 AND step = $3 AND attempt = $4`, c.Tenant, c.Trajectory, c.Step, c.Attempt)
	if err != nil {
		return fmt.Errorf("delete checkpoint: %w", err)
	}
	return nil
}

// MoveSteps implements store.Store.
func (s *Store) MoveSteps(ctx context.Context, tenant, trajectory string, upTo int64, to store.StepPlace) (int, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE trajectory_steps SET sandbox = $1, generation = $2
		WHERE tenant = $3 AND trajectory = $4 AND step <= $5 AND state = $6`,
		to.Sandbox, to.Generation, tenant, trajectory, upTo, api.StepDone)
	if err != nil {
		return 0, fmt.Errorf("move trajectory steps: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// DeleteLayer implements store.Store.
func (s *Store) DeleteLayer(ctx context.Context, tenant, name, tag, digest string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM layers WHERE tenant = $1 AND name = $2 AND tag = $3 AND digest = $4`,
		tenant, name, tag, digest)
	if err != nil {
		return fmt.Errorf("delete layer: %w", err)
	}
	return nil
}

// LayerInUse implements store.Store. Digests are long hex strings, so a
// substring match on the space-separated parents and on a sandbox's JSON
// document finds exactly the records that hold one.
func (s *Store) LayerInUse(ctx context.Context, digest string) (bool, error) {
	var inUse bool
	err := s.pool.QueryRow(ctx, `SELECT
		EXISTS (SELECT 1 FROM layers WHERE digest = $1) OR
		EXISTS (SELECT 1 FROM layers WHERE strpos(parents, $1) > 0) OR
		EXISTS (SELECT 1 FROM sandboxes WHERE deleted_at IS NULL AND strpos(doc::text, $1) > 0)`,
		digest).Scan(&inUse)
	if err != nil {
		return false, fmt.Errorf("layer in use: %w", err)
	}
	return inUse, nil
}
