package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/sqlstore"
)

// PutTrajectory implements store.Store.
func (s *Store) PutTrajectory(ctx context.Context, t store.Trajectory) error {
	err := s.durable(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, sqlstore.TrajectoryPut, sqlstore.TrajectoryArgs(t)...)
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
	err := sqlstore.ScanTrajectory(s.r.QueryRowContext(ctx, sqlstore.TrajectoryGet, tenant, id), &t)
	if errors.Is(err, sql.ErrNoRows) {
		return t, errdefs.NotFound("trajectory %s", id)
	}
	if err != nil {
		return t, fmt.Errorf("get trajectory: %w", err)
	}
	return t, nil
}

// AddCheckpoint implements store.Store.
func (s *Store) AddCheckpoint(ctx context.Context, c store.Checkpoint) error {
	err := s.durable(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, sqlstore.CheckpointInsert, sqlstore.CheckpointArgs(c)...)
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
	rows, err := s.r.QueryContext(ctx, sqlstore.CheckpointList, tenant, trajectory)
	return collect(rows, err, "list checkpoints", sqlstore.ScanCheckpoint)
}

// DropCheckpoint implements store.Store.
func (s *Store) DropCheckpoint(ctx context.Context, c store.Checkpoint) error {
	if _, err := s.w.ExecContext(ctx, sqlstore.CheckpointDrop, sqlstore.CheckpointDropArgs(c)...); err != nil {
		return fmt.Errorf("drop checkpoint: %w", err)
	}
	return nil
}

// DeadCheckpoints implements store.Store.
func (s *Store) DeadCheckpoints(ctx context.Context, limit int) ([]store.Checkpoint, error) {
	rows, err := s.r.QueryContext(ctx, sqlstore.CheckpointsDead, limit)
	return collect(rows, err, "list dead checkpoints", sqlstore.ScanCheckpoint)
}

// DeleteCheckpoint implements store.Store.
func (s *Store) DeleteCheckpoint(ctx context.Context, c store.Checkpoint) error {
	if _, err := s.w.ExecContext(ctx, sqlstore.CheckpointDelete, sqlstore.CheckpointKey(c)...); err != nil {
		return fmt.Errorf("delete checkpoint: %w", err)
	}
	return nil
}

// MoveSteps implements store.Store.
func (s *Store) MoveSteps(ctx context.Context, tenant, trajectory string, upTo int64, to store.StepPlace) (int, error) {
	var n int64
	err := s.durable(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlstore.StepsMove, sqlstore.StepsMoveArgs(tenant, trajectory, upTo, to)...)
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
	if _, err := s.w.ExecContext(ctx, sqlstore.LayerDelete, tenant, name, tag, digest); err != nil {
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

var layerUnused = sqlstore.LayerUnused("instr", "s.doc")

// UnusedLayers implements store.Store.
func (s *Store) UnusedLayers(ctx context.Context, prefix string, before time.Time, limit int) ([]store.Layer, error) {
	rows, err := s.r.QueryContext(ctx, layerUnused, sqlstore.UnusedLayersArgs(prefix, before, limit)...)
	return collect(rows, err, "unused layers", sqlstore.ScanLayer)
}
