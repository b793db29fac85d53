package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/sqlstore"
)

// PutTrajectory implements store.Store.
func (s *Store) PutTrajectory(ctx context.Context, t store.Trajectory) error {
	if _, err := s.pool.Exec(ctx, trajectoryPut, sqlstore.TrajectoryArgs(t)...); err != nil {
		return fmt.Errorf("put trajectory: %w", err)
	}
	return nil
}

// GetTrajectory implements store.Store.
func (s *Store) GetTrajectory(ctx context.Context, tenant, id string) (store.Trajectory, error) {
	t := store.Trajectory{Tenant: tenant, ID: id}
	err := sqlstore.ScanTrajectory(s.pool.QueryRow(ctx, trajectoryGet, tenant, id), &t)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, errdefs.NotFound("trajectory %s", id)
	}
	if err != nil {
		return t, fmt.Errorf("get trajectory: %w", err)
	}
	return t, nil
}

// AddCheckpoint implements store.Store.
func (s *Store) AddCheckpoint(ctx context.Context, c store.Checkpoint) error {
	_, err := s.pool.Exec(ctx, checkpointInsert, sqlstore.CheckpointArgs(c)...)
	if isUnique(err) {
		return fmt.Errorf("checkpoint of trajectory %s at step %d: %w", c.Trajectory, c.Step, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("add checkpoint: %w", err)
	}
	return nil
}

// ListCheckpoints implements store.Store.
func (s *Store) ListCheckpoints(ctx context.Context, tenant, trajectory string) ([]store.Checkpoint, error) {
	rows, err := s.pool.Query(ctx, checkpointList, tenant, trajectory)
	return collect(rows, err, "list checkpoints", sqlstore.ScanCheckpoint)
}

// DeadCheckpoints implements store.Store.
func (s *Store) DeadCheckpoints(ctx context.Context, limit int) ([]store.Checkpoint, error) {
	rows, err := s.pool.Query(ctx, checkpointsDead, limit)
	return collect(rows, err, "list dead checkpoints", sqlstore.ScanCheckpoint)
}

// DropCheckpoint implements store.Store.
func (s *Store) DropCheckpoint(ctx context.Context, c store.Checkpoint) error {
	if _, err := s.pool.Exec(ctx, checkpointDrop, sqlstore.CheckpointDropArgs(c)...); err != nil {
		return fmt.Errorf("drop checkpoint: %w", err)
	}
	return nil
}

// DeleteCheckpoint implements store.Store.
func (s *Store) DeleteCheckpoint(ctx context.Context, c store.Checkpoint) error {
	if _, err := s.pool.Exec(ctx, checkpointDelete, sqlstore.CheckpointKey(c)...); err != nil {
		return fmt.Errorf("delete checkpoint: %w", err)
	}
	return nil
}

// MoveSteps implements store.Store.
func (s *Store) MoveSteps(ctx context.Context, tenant, trajectory string, upTo int64, to store.StepPlace) (int, error) {
	tag, err := s.pool.Exec(ctx, stepsMove, sqlstore.StepsMoveArgs(tenant, trajectory, upTo, to)...)
	if err != nil {
		return 0, fmt.Errorf("move trajectory steps: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// DeleteLayer implements store.Store.
func (s *Store) DeleteLayer(ctx context.Context, tenant, name, tag, digest string) error {
	if _, err := s.pool.Exec(ctx, layerDelete, tenant, name, tag, digest); err != nil {
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

var layerUnused = rebind(sqlstore.LayerUnused("strpos", "s.doc::text"))

// UnusedLayers implements store.Store.
func (s *Store) UnusedLayers(ctx context.Context, prefix string, before time.Time, limit int) ([]store.Layer, error) {
	rows, err := s.pool.Query(ctx, layerUnused, sqlstore.UnusedLayersArgs(prefix, before, limit)...)
	return collect(rows, err, "unused layers", sqlstore.ScanLayer)
}
