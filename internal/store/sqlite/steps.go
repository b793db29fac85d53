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

// durable runs fn in a write transaction that is on disk when it commits.
// The database runs with synchronous=NORMAL, which in WAL mode survives a
// crash of the process but may lose the last commits to a power cut; the
// trajectory log promises more, so its writes switch the one writer
// connection to synchronous=FULL (an fsync of the WAL per commit) for the
// length of the transaction. Holding the connection queues other writers
// in database/sql, not in SQLite's busy loop.
func (s *Store) durable(ctx context.Context, fn func(*sql.Tx) error) error {
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `PRAGMA synchronous = FULL`); err != nil {
		return err
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA synchronous = NORMAL`)
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// GetStep implements store.Store.
func (s *Store) GetStep(ctx context.Context, tenant, trajectory string, step int64) (store.Step, error) {
	var result []byte
	st, err := sqlstore.ScanStep(s.r.QueryRowContext(ctx, sqlstore.StepGet, tenant, trajectory, step), &result)
	if errors.Is(err, sql.ErrNoRows) {
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
	rows, err := s.r.QueryContext(ctx, sqlstore.StepList, tenant, trajectory)
	return collect(rows, err, "list trajectory steps", func(sc sqlstore.Scanner) (store.Step, error) {
		return sqlstore.ScanStep(sc, nil)
	})
}

// BeginStep implements store.Store.
func (s *Store) BeginStep(ctx context.Context, st store.Step) error {
	err := s.durable(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlstore.StepsDelete, st.Tenant, st.Trajectory, st.Step); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, sqlstore.StepInsert, sqlstore.StepInsertArgs(st)...)
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
	var n int64
	err = s.durable(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlstore.StepFinish, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("finish trajectory step: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("finish trajectory %s step %d: %w", st.Trajectory, st.Step, store.ErrConflict)
	}
	return nil
}

// StepReplayed implements store.Store. A count for the dashboard, not a
// record a crash must keep: it is not written durably.
func (s *Store) StepReplayed(ctx context.Context, st store.Step, at time.Time) error {
	if _, err := s.w.ExecContext(ctx, sqlstore.StepReplayed, sqlstore.StepReplayedArgs(st, at)...); err != nil {
		return fmt.Errorf("count trajectory step replay: %w", err)
	}
	return nil
}

// DeleteSteps implements store.Store.
func (s *Store) DeleteSteps(ctx context.Context, tenant, trajectory string, from int64) (int, error) {
	res, err := s.w.ExecContext(ctx, sqlstore.StepsDelete, tenant, trajectory, max(from, 0))
	if err != nil {
		return 0, fmt.Errorf("delete trajectory steps: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// PurgeTrajectories implements store.Store.
func (s *Store) PurgeTrajectories(ctx context.Context, before time.Time) (int, error) {
	res, err := s.w.ExecContext(ctx, sqlstore.TrajectoriesPurge, sqlstore.Nanos(before))
	if err != nil {
		return 0, fmt.Errorf("purge trajectories: %w", err)
	}
	n, _ := res.RowsAffected()
	// Settings of trajectories left without steps go once they are as old.
	if _, err := s.w.ExecContext(ctx, sqlstore.TrajectorySettingsPurge, sqlstore.Nanos(before)); err != nil {
		return int(n), fmt.Errorf("purge trajectory settings: %w", err)
	}
	return int(n), nil
}
