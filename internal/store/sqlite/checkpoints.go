package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// PutTrajectory implements store.Store.
func (s *Store) PutTrajectory(ctx context.Context, t store.Trajectory) error {
	err := s.durable(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO trajectories (tenant, id, checkpoint_every, updated_at)
			VALUES (?, ?, ?, ?) ON CONFLICT (tenant, id) DO UPDATE SET
			checkpoint_every = excluded.checkpoint_every, updated_at = excluded.updated_at`,
			t.Tenant, t.ID, t.CheckpointEvery, nanos(t.UpdatedAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("put trajectory: %w", err)
	}
	return nil
}

// GetTrajectory implements store.Store.
func (s *Store) GetTrajectory(ctx context.Context, tenant, id string) (store.Trajectory, error) {
	t := store.Trajectory{Tenant: tenant, ID: id}
	var updated int64
	err := s.r.QueryRowContext(ctx, `SELECT checkpoint_every, updated_at FROM trajectories WHERE tenant = ? AND id = ?`,
		tenant, id).Scan(&t.CheckpointEvery, &updated)
	if errors.Is(err, sql.ErrNoRows) {
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

func scanCheckpoints(rows *sql.Rows) ([]store.Checkpoint, error) {
	defer rows.Close()
	var out []store.Checkpoint
	for rows.Next() {
		var c store.Checkpoint
		var spec string
		var created int64
		if err := rows.Scan(&c.Tenant, &c.Trajectory, &c.Step, &c.Attempt, &c.LayerName, &c.LayerTag, &c.Digest,
			&c.Size, &c.Sandbox, &c.Generation, &spec, &created, &c.Dropped); err != nil {
			return nil, err
		}
		c.Spec, c.CreatedAt = []byte(spec), fromNanos(created)
		out = append(out, c)
	}
	return out, rows.Err()
}

// AddCheckpoint implements store.Store.
func (s *Store) AddCheckpoint(ctx context.Context, c store.Checkpoint) error {
	err := s.durable(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO trajectory_checkpoints (tenant, trajectory, step, attempt,
			layer_name, layer_tag, digest, size, sandbox, generation, spec, created_at, dropped)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)`,
			c.Tenant, c.Trajectory, c.Step, c.Attempt, c.LayerName, c.LayerTag, c.Digest, c.Size,
			c.Sandbox, c.Generation, string(c.Spec), nanos(c.CreatedAt))
		if isUnique(err) {
			return fmt.Errorf("checkpoint of trajectory %s at step %d: %w", c.Trajectory, c.Step, errdefs.ErrAlreadyExists)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("add checkpoint: %w", err)
	}
	return nil
}

// ListCheckpoints implements store.Store.
func (s *Store) ListCheckpoints(ctx context.Context, tenant, trajectory string) ([]store.Checkpoint, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+checkpointCols+` FROM trajectory_checkpoints c
		WHERE c.tenant = ? AND c.trajectory = ? AND `+live+` ORDER BY c.step`, tenant, trajectory)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	out, err := scanCheckpoints(rows)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	return out, nil
}

// DropCheckpoint implements store.Store.
func (s *Store) DropCheckpoint(ctx context.Context, c store.Checkpoint) error {
	_, err := s.w.ExecContext(ctx, `UPDATE trajectory_checkpoints SET dropped = 1
		WHERE tenant = ? AND trajectory = ? AND step = ? AND attempt = ?`, c.Tenant, c.Trajectory, c.Step, c.Attempt)
	if err != nil {
		return fmt.Errorf("drop checkpoint: %w", err)
	}
	return nil
}

// DeadCheckpoints implements store.Store.
func (s *Store) DeadCheckpoints(ctx context.Context, limit int) ([]store.Checkpoint, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+checkpointCols+` FROM trajectory_checkpoints c
		WHERE NOT (`+live+`) ORDER BY c.created_at LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead checkpoints: %w", err)
	}
	out, err := scanCheckpoints(rows)
	if err != nil {
		return nil, fmt.Errorf("list dead checkpoints: %w", err)
	}
	return out, nil
}

// DeleteCheckpoint implements store.Store.
func (s *Store) DeleteCheckpoint(ctx context.Context, c store.Checkpoint) error {
	_, err := s.w.ExecContext(ctx, `DELETE FROM trajectory_checkpoints
		WHERE tenant = ? AND trajectory = ? AND step = ? AND attempt = ?`, c.Tenant, c.Trajectory, c.Step, c.Attempt)
	if err != nil {
		return fmt.Errorf("delete checkpoint: %w", err)
	}
	return nil
}

// MoveSteps implements store.Store.
func (s *Store) MoveSteps(ctx context.Context, tenant, trajectory string, upTo int64, to store.StepPlace) (int, error) {
	var n int64
	err := s.durable(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE trajectory_steps SET sandbox = ?, generation = ?
			WHERE tenant = ? AND trajectory = ? AND step <= ? AND state = ?`,
			to.Sandbox, to.Generation, tenant, trajectory, upTo, api.StepDone)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("move trajectory steps: %w", err)
	}
	return int(n), nil
}

// DeleteLayer implements store.Store.
func (s *Store) DeleteLayer(ctx context.Context, tenant, name, tag, digest string) error {
	_, err := s.w.ExecContext(ctx, `DELETE FROM layers WHERE tenant = ? AND name = ? AND tag = ? AND digest = ?`,
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
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT
		EXISTS (SELECT 1 FROM layers WHERE digest = ?) OR
		EXISTS (SELECT 1 FROM layers WHERE instr(parents, ?) > 0) OR
		EXISTS (SELECT 1 FROM sandboxes WHERE deleted_at IS NULL AND instr(doc, ?) > 0)`,
		digest, digest, digest).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("layer in use: %w", err)
	}
	return n != 0, nil
}
