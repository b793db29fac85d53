package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
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

const stepCols = `tenant, trajectory, step, fingerprint, attempt, sandbox, generation, state, exit_code, started_at, recorded_at`

func scanStep(sc interface{ Scan(...any) error }, result *sql.NullString) (store.Step, error) {
	var st store.Step
	var exit sql.NullInt64
	var started int64
	var recorded sql.NullInt64
	dest := []any{&st.Tenant, &st.Trajectory, &st.Step, &st.Fingerprint, &st.Attempt, &st.Sandbox,
		&st.Generation, &st.State, &exit, &started, &recorded}
	if result != nil {
		dest = append(dest, result)
	}
	if err := sc.Scan(dest...); err != nil {
		return st, err
	}
	if exit.Valid {
		c := int(exit.Int64)
		st.ExitCode = &c
	}
	st.StartedAt = fromNanos(started)
	if recorded.Valid {
		t := fromNanos(recorded.Int64)
		st.RecordedAt = &t
	}
	return st, nil
}

// GetStep implements store.Store.
func (s *Store) GetStep(ctx context.Context, tenant, trajectory string, step int64) (store.Step, error) {
	var result sql.NullString
	st, err := scanStep(s.r.QueryRowContext(ctx, `SELECT `+stepCols+`, result FROM trajectory_steps
		WHERE tenant = ? AND trajectory = ? AND step = ?`, tenant, trajectory, step), &result)
	if errors.Is(err, sql.ErrNoRows) {
		return st, errdefs.NotFound("trajectory %s step %d", trajectory, step)
	}
	if err != nil {
		return st, fmt.Errorf("get trajectory step: %w", err)
	}
	if result.Valid {
		st.Result = new(api.ExecResult)
		if err := json.Unmarshal([]byte(result.String), st.Result); err != nil {
			return st, fmt.Errorf("decode trajectory step result: %w", err)
		}
	}
	return st, nil
}

// ListSteps implements store.Store.
func (s *Store) ListSteps(ctx context.Context, tenant, trajectory string) ([]store.Step, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+stepCols+` FROM trajectory_steps
		WHERE tenant = ? AND trajectory = ? ORDER BY step`, tenant, trajectory)
	if err != nil {
		return nil, fmt.Errorf("list trajectory steps: %w", err)
	}
	defer rows.Close()
	var out []store.Step
	for rows.Next() {
		st, err := scanStep(rows, nil)
		if err != nil {
			return nil, fmt.Errorf("list trajectory steps: %w", err)
		}
		out = append(out, st)
	}
	return out, rows.Err()
}

// BeginStep implements store.Store.
func (s *Store) BeginStep(ctx context.Context, st store.Step) error {
	err := s.durable(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM trajectory_steps WHERE tenant = ? AND trajectory = ? AND step >= ?`,
			st.Tenant, st.Trajectory, st.Step); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO trajectory_steps (`+stepCols+`, result)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, NULL, NULL)`,
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
	var n int64
	err = s.durable(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE trajectory_steps SET state = ?, exit_code = ?, result = ?, recorded_at = ?
			WHERE tenant = ? AND trajectory = ? AND step = ? AND attempt = ? AND state = ?`,
			api.StepDone, st.Result.ExitCode, string(doc), nanos(recorded),
			st.Tenant, st.Trajectory, st.Step, st.Attempt, api.StepRunning)
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

// DeleteSteps implements store.Store.
func (s *Store) DeleteSteps(ctx context.Context, tenant, trajectory string, from int64) (int, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM trajectory_steps WHERE tenant = ? AND trajectory = ? AND step >= ?`,
		tenant, trajectory, max(from, 0))
	if err != nil {
		return 0, fmt.Errorf("delete trajectory steps: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// PurgeTrajectories implements store.Store.
func (s *Store) PurgeTrajectories(ctx context.Context, before time.Time) (int, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM trajectory_steps WHERE (tenant, trajectory) IN (
		SELECT tenant, trajectory FROM trajectory_steps GROUP BY tenant, trajectory HAVING MAX(started_at) < ?)`,
		nanos(before))
	if err != nil {
		return 0, fmt.Errorf("purge trajectories: %w", err)
	}
	n, _ := res.RowsAffected()
	// Settings of trajectories left without steps go once they are as old.
	if _, err := s.w.ExecContext(ctx, `DELETE FROM trajectories WHERE updated_at < ? AND NOT EXISTS (
		SELECT 1 FROM trajectory_steps t WHERE t.tenant = trajectories.tenant AND t.trajectory = trajectories.id)`,
		nanos(before)); err != nil {
		return int(n), fmt.Errorf("purge trajectory settings: %w", err)
	}
	return int(n), nil
}
