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

// The trajectory log. PostgreSQL commits are durable (the WAL is flushed)
// unless the server is configured otherwise, so BeginStep and FinishStep
// are on disk when they return.

// GetStep implements store.Store.
func (s *Store) GetStep(ctx context.Context, tenant, trajectory string, step int64) (store.Step, error) {
	var result []byte
	st, err := sqlstore.ScanStep(s.pool.QueryRow(ctx, stepGet, tenant, trajectory, step), &result)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, errdefs.NotFound("trajectory %s step %d", trajectory, step)
	}
	if err != nil {
		return st, fmt.Errorf("get trajectory step: %w", err)
	}
	st.Result, err = sqlstore.StepResult(result)
	return st, err
}

// ListSteps implements store.Store.
func (s *Store) ListSteps(ctx context.Context, tenant, trajectory string) ([]store.Step, error) {
	rows, err := s.pool.Query(ctx, stepList, tenant, trajectory)
	return collect(rows, err, "list trajectory steps", func(sc sqlstore.Scanner) (store.Step, error) {
		return sqlstore.ScanStep(sc, nil)
	})
}

// BeginStep implements store.Store.
func (s *Store) BeginStep(ctx context.Context, st store.Step) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, stepsDelete, st.Tenant, st.Trajectory, st.Step); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, stepInsert, sqlstore.StepInsertArgs(st)...)
		return err
	})
	if err != nil {
		return fmt.Errorf("begin trajectory step: %w", err)
	}
	return nil
}

// FinishStep implements store.Store.
func (s *Store) FinishStep(ctx context.Context, st store.Step) error {
	args, err := sqlstore.StepFinishArgs(st)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, stepFinish, args...)
	if err != nil {
		return fmt.Errorf("finish trajectory step: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("finish trajectory %s step %d: %w", st.Trajectory, st.Step, store.ErrConflict)
	}
	return nil
}

// StepReplayed implements store.Store.
func (s *Store) StepReplayed(ctx context.Context, st store.Step, at time.Time) error {
	if _, err := s.pool.Exec(ctx, stepReplayed, sqlstore.StepReplayedArgs(st, at)...); err != nil {
		return fmt.Errorf("count trajectory step replay: %w", err)
	}
	return nil
}

// DeleteSteps implements store.Store.
func (s *Store) DeleteSteps(ctx context.Context, tenant, trajectory string, from int64) (int, error) {
	tag, err := s.pool.Exec(ctx, stepsDelete, tenant, trajectory, max(from, 0))
	if err != nil {
		return 0, fmt.Errorf("delete trajectory steps: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// PurgeTrajectories implements store.Store.
func (s *Store) PurgeTrajectories(ctx context.Context, before time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, trajectoriesPurge, sqlstore.Nanos(before))
	if err != nil {
		return 0, fmt.Errorf("purge trajectories: %w", err)
	}
	// Settings of trajectories left without steps go once they are as old.
	if _, err := s.pool.Exec(ctx, trajectorySettingsPurge, sqlstore.Nanos(before)); err != nil {
		return int(tag.RowsAffected()), fmt.Errorf("purge trajectory settings: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
