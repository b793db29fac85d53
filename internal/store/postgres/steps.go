package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// The trajectory log. PostgreSQL commits are durable (the WAL is flushed)
// unless the server is configured otherwise, so BeginStep and FinishStep
// are on disk when they return.

const stepCols = `tenant, trajectory, step, fingerprint, attempt, sandbox, generation, state, exit_code, started_at, recorded_at`

func scanStep(r pgx.Row, result *[]byte) (store.Step, error) {
	var st store.Step
	var exit *int32
	var started int64
	var recorded *int64
	dest := []any{&st.Tenant, &st.Trajectory, &st.Step, &st.Fingerprint, &st.Attempt, &st.Sandbox,
		&st.Generation, &st.State, &exit, &started, &recorded}
	if result != nil {
		dest = append(dest, result)
	}
	if err := r.Scan(dest...); err != nil {
		return st, err
	}
	if exit != nil {
		c := int(*exit)
		st.ExitCode = &c
	}
	st.StartedAt = fromNanos(started)
	if recorded != nil {
		t := fromNanos(*recorded)
		st.RecordedAt = &t
	}
	return st, nil
}

// GetStep implements store.Store.
func (s *Store) GetStep(ctx context.Context, tenant, trajectory string, step int64) (store.Step, error) {
	var result []byte
	st, err := scanStep(s.pool.QueryRow(ctx, `SELECT `+stepCols+`, result FROM trajectory_steps
		WHERE tenant = $1 AND trajectory = $2 AND step = $3`, tenant, trajectory, step), &result)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, errdefs.NotFound("trajectory %s step %d", trajectory, step)
	}
	if err != nil {
		return st, fmt.Errorf("get trajectory step: %w", err)
	}
	if result != nil {
		st.Result = new(api.ExecResult)
		if err := json.Unmarshal(result, st.Result); err != nil {
			return st, fmt.Errorf("decode trajectory step result: %w", err)
		}
	}
	return st, nil
}

// ListSteps implements store.Store.
func (s *Store) ListSteps(ctx context.Context, tenant, trajectory string) ([]store.Step, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+stepCols+` FROM trajectory_steps
		WHERE tenant = $1 AND trajectory = $2 ORDER BY step`, tenant, trajectory)
	if err != nil {
		return nil, fmt.Errorf("list trajectory steps: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Step, error) { return scanStep(r, nil) })
	if err != nil {
		return nil, fmt.Errorf("list trajectory steps: %w", err)
	}
	return out, nil
}

// BeginStep implements store.Store.
func (s *Store) BeginStep(ctx context.Context, st store.Step) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM trajectory_steps WHERE tenant = $1 AND trajectory = $2 AND step >= $3`,
			st.Tenant, st.Trajectory, st.Step); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO trajectory_steps (`+stepCols+`, result)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9, NULL, NULL)`,
			st.Tenant, st.Trajectory, st.Step, st.Fingerprint, st.Attempt, st.Sandbox, st.Generation,
			api.StepRunning, nanos(st.StartedAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("begin trajectory step: %w", err)
	}
	return nil
}

// FinishStep implements store.Store.
func (s *Store) FinishStep(ctx context.Context, st store.Step) error {
	if st.Result == nil {
		return errdefs.Invalid("finish trajectory step %d without a result", st.Step)
	}
	doc, err := json.Marshal(st.Result)
	if err != nil {
		return fmt.Errorf("encode trajectory step result: %w", err)
	}
	recorded := time.Now()
	if st.RecordedAt != nil {
		recorded = *st.RecordedAt
	}
	tag, err := s.pool.Exec(ctx, `UPDATE trajectory_steps SET state = $1, exit_code = $2, result = $3, recorded_at = $4
		WHERE tenant = $5 AND trajectory = $6 AND step = $7 AND attempt = $8 AND state = $9`,
		api.StepDone, st.Result.ExitCode, string(doc), nanos(recorded),
		st.Tenant, st.Trajectory, st.Step, st.Attempt, api.StepRunning)
	if err != nil {
		return fmt.Errorf("finish trajectory step: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("finish trajectory %s step %d: %w", st.Trajectory, st.Step, store.ErrConflict)
	}
	return nil
}

// DeleteSteps implements store.Store.
func (s *Store) DeleteSteps(ctx context.Context, tenant, trajectory string, from int64) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM trajectory_steps WHERE tenant = $1 AND trajectory = $2 AND step >= $3`,
		tenant, trajectory, max(from, 0))
	if err != nil {
		return 0, fmt.Errorf("delete trajectory steps: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// PurgeTrajectories implements store.Store.
func (s *Store) PurgeTrajectories(ctx context.Context, before time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM trajectory_steps WHERE (tenant, trajectory) IN (
		SELECT tenant, trajectory FROM trajectory_steps GROUP BY tenant, trajectory HAVING MAX(started_at) < $1)`,
		nanos(before))
	if err != nil {
		return 0, fmt.Errorf("purge trajectories: %w", err)
	}
	// Settings of trajectories left without steps go once they are as old.
	if _, err := s.pool.Exec(ctx, `DELETE FROM trajectories t WHERE t.updated_at < $1 AND NOT EXISTS (
		SELECT 1 FROM trajectory_steps s WHERE s.tenant = t.tenant AND s.trajectory = t.id)`, nanos(before)); err != nil {
		return int(tag.RowsAffected()), fmt.Errorf("purge trajectory settings: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
